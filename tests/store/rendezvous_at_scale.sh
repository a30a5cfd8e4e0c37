#!/usr/bin/env bash
# 1024 ranks rendezvous through one ddp TCPStore server while 64 hostile
# clients (garbage bytes, an oversized message, slow loris, silent
# connections; bench/rendezvous_bench.cpp) keep at it: every rank completes
# the arrival step of init_process_group (claim, world-size vote, arrival,
# wait for all) within its 60 s deadline, and the server drops the hostile
# connections instead of stalling on them. Then the same world alone.
#
# Usage: rendezvous_at_scale.sh <rendezvous_bench>
# Prints "rendezvous_at_scale: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
bench=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-rendezvous-scale.XXXXXX")
coproc server { exec "$bench" serve 2>"$work/server.log"; }
trap 'eval "exec ${server[1]}>&-" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
read -r word port <&"${server[0]}"
if [ "$word" != port ]; then
  echo "rendezvous_at_scale: the server did not start"
  cat "$work/server.log"
  exit 1
fi

# ranks WORLD HOSTILE: the clients' run; its line in $work/line.
ranks() {
  "$bench" clients --port "$port" --world "$1" --hostile "$2" --timeout-s 60 >"$work/line" 2>"$work/clients.log" || {
    tail -n 20 "$work/clients.log"
    return 1
  }
  cat "$work/line"
}
line_says() { grep -qE "$1" "$work/line"; }
dropped() { grep -qE "refused a message|closed the connection" "$work/server.log"; }

check "1024 ranks complete their rendezvous beside 64 hostile clients" ranks 1024 64
check "every hostile kind connected, and was dropped and came back" \
  line_says "world=1024 hostile=64 .* hostile_connections=([1-9][0-9]{2,}|6[5-9]|[7-9][0-9])$"
check "the server said why it dropped hostile connections" dropped
check "1024 ranks complete their rendezvous alone, on the same server" ranks 1024 0
checks_summary rendezvous_at_scale
