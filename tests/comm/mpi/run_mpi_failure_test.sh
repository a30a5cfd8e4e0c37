#!/bin/sh
# Runs a command that must fail (a job under mpirun that a stuck collective
# or a killed rank has to end) and checks how it ended.
#
# Usage: run_mpi_failure_test.sh MAX_SECONDS PATTERN... -- COMMAND [ARGS...]
#
# Passes when COMMAND exits non-zero within MAX_SECONDS (it is killed at
# MAX_SECONDS + 30, which fails the test), and its output (stdout and stderr
# together) matches every extended regular expression PATTERN.
set -u
max_seconds=$1
shift
patterns_file=$(mktemp)
trap 'rm -f "$patterns_file" "$patterns_file.out"' EXIT
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  printf '%s\n' "$1" >>"$patterns_file"
  shift
done
[ $# -gt 1 ] || { echo "usage: $0 MAX_SECONDS PATTERN... -- COMMAND [ARGS...]" >&2; exit 2; }
shift # --

start=$(date +%s)
timeout $((max_seconds + 30)) "$@" >"$patterns_file.out" 2>&1
code=$?
elapsed=$(($(date +%s) - start))
cat "$patterns_file.out"
echo "run_mpi_failure_test: exit code $code after ${elapsed} s"

failed=0
if [ "$code" -eq 0 ]; then
  echo "run_mpi_failure_test: FAILED: the job exited 0, expected a failure"
  failed=1
fi
if [ "$code" -eq 124 ] || [ "$elapsed" -gt "$max_seconds" ]; then
  echo "run_mpi_failure_test: FAILED: the job took ${elapsed} s, more than ${max_seconds} s (it hung)"
  failed=1
fi
while IFS= read -r pattern; do
  if ! grep -E -q -- "$pattern" "$patterns_file.out"; then
    echo "run_mpi_failure_test: FAILED: nothing in the output matches: $pattern"
    failed=1
  fi
done <"$patterns_file"
[ "$failed" -eq 0 ] && echo "run_mpi_failure_test: OK"
exit "$failed"
