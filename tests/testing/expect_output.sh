#!/bin/sh
# Runs a program and judges it by its exit status AND its output, which
# CTest's PASS_REGULAR_EXPRESSION cannot do: with that property CTest ignores
# the exit status, so a program that printed the expected line and then
# failed, crashed, or had a sanitizer report passed (tests/CMakeLists.txt,
# ddp_add_output_test, uses this instead).
#
#   expect_output.sh EXIT REGEX MATCHES FORBID COMMAND [ARGS...]
#
#   EXIT     0: the program must succeed; nonzero: it must fail with an exit
#            status of its own (1 to 125), not a signal or a launcher's
#            "command not found"
#   REGEX    an extended regular expression (grep -E) that some line of the
#            output (stdout and stderr together) must match
#   MATCHES  how many lines must match at least (e.g. one per rank)
#   FORBID   an extended regular expression no line may match (empty: none
#            besides the sanitizers' reports, which are always forbidden)
#
# Prints the program's output, then each check, then
# "expect_output: N of N checks passed"; exits 0 when all passed, else 1.
set -u

if [ $# -lt 5 ]; then
  echo "usage: $0 EXIT REGEX MATCHES FORBID COMMAND [ARGS...]" >&2
  exit 2
fi
expected_exit=$1
regex=$2
matches=$3
forbid=$4
shift 4

out=$(mktemp "${TMPDIR:-/tmp}/ddp-expect.XXXXXX") || exit 2
trap 'rm -f "$out"' EXIT

"$@" >"$out" 2>&1
rc=$?
cat "$out"
echo "--- expect_output: exit status $rc"

. "$(dirname "$0")/checks.sh"

case $expected_exit in
  0) check "exit status 0 (got $rc)" [ "$rc" -eq 0 ] ;;
  nonzero) check "a failure of the program's own, exit status 1-125 (got $rc)" \
    [ "$rc" -ge 1 -a "$rc" -le 125 ] ;;
  *) echo "expect_output.sh: EXIT must be 0 or nonzero (got '$expected_exit')" >&2; exit 2 ;;
esac
found=$(grep -E -c -- "$regex" "$out")
check "at least $matches line(s) match '$regex' (found $found)" [ "$found" -ge "$matches" ]
sanitizers='ERROR: AddressSanitizer|ERROR: LeakSanitizer|WARNING: ThreadSanitizer|SUMMARY: UndefinedBehaviorSanitizer|runtime error: '
check "no sanitizer report" sh -c '! grep -E -q -- "$1" "$2"' sh "$sanitizers" "$out"
if [ -n "$forbid" ]; then
  check "no line matches '$forbid'" sh -c '! grep -E -q -- "$1" "$2"' sh "$forbid" "$out"
fi

checks_summary expect_output
