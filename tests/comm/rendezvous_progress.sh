#!/usr/bin/env bash
# The rendezvous says whom it waits for (Note [Rendezvous progress] in
# src/comm/gloo/gloo_rendezvous.cpp). Usage:
#   rendezvous_progress.sh <init_exit_main> <python3>
# init_exit_main's ranks start with a 4 s deadline, as plain processes:
#   late     rank 1 starts once rank 0 has said "[rank 0/2]
#            init_process_group: waiting for rank 1 to join (1 s of 4 s)"
#            (DDP_RENDEZVOUS_PROGRESS_S=1); rank 0 says no more than "(2 s"
#            and "(3 s of 4 s)" after it, never gives up, and both complete;
#   missing  rank 1 never starts: rank 0 says it each second, then "(4 s of
#            4 s): giving up", and fails with the timeout naming rank 1;
#   off      DDP_RENDEZVOUS_PROGRESS_S=0 and rank 1 late: not a word, both
#            complete;
#   bad      DDP_RENDEZVOUS_PROGRESS_S=soon: an error naming the variable.
# Prints "rendezvous_progress: N of N checks passed" at the end (checks.sh).
set -uo pipefail
. "$(dirname "$0")/../testing/free_port.sh"
. "$(dirname "$0")/../testing/checks.sh"
program=$1
python=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-rdzv-progress.XXXXXX")
trap 'rm -rf "$work"' EXIT

# start <dir> <port> <rank> <progress> [go-file]: one rank of 2, in the
# background; with a go-file, it loads and then waits for that file before
# init_process_group (init_exit_main's INIT_EXIT_WAIT_FOR).
start() {
  RANK=$3 LOCAL_RANK=$3 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$2 \
    DDP_RENDEZVOUS_PROGRESS_S=$4 INIT_EXIT_WAIT_FOR=${5:-} OMP_NUM_THREADS=1 \
    timeout -s KILL 60 "$program" >"$1/$3.log" 2>&1 &
}

lines() { grep -cE "$2" "$1" || true; }

# late
dir=$work/late; mkdir -p "$dir"; port=$(free_port "$python")
start "$dir" "$port" 0 1; p0=$!
# Rank 1 starts with rank 0, loads LibTorch meanwhile (seconds on a loaded
# machine, more under ASan), and joins once rank 0 has said it waits: well
# within the 4 s deadline however slow the start-up.
start "$dir" "$port" 1 1 "$dir/go"; p1=$!
for ((i = 0; i < 300; i++)); do
  grep -q 'waiting for' "$dir/0.log" 2>/dev/null && break
  sleep 0.1
done
touch "$dir/go"
wait $p0; rc0=$?; wait $p1; rc1=$?
sed 's/^/  late rank 0: /' "$dir/0.log"
check late test $rc0 -eq 0 -a $rc1 -eq 0 \
  -a "$(lines "$dir/0.log" '^\[ddp info\] \[rank 0/2\] init_process_group: waiting for rank 1 to join \(1 s of 4 s\)$')" = 1 \
  -a "$(lines "$dir/0.log" '^\[ddp info\] \[rank 0/2\] init_process_group: waiting for rank 1 to join \([123] s of 4 s\)$')" = "$(lines "$dir/0.log" 'waiting for')" \
  -a "$(lines "$dir/0.log" 'giving up')" = 0 \
  -a "$(lines "$dir/1.log" 'waiting for')" = 0

# missing
dir=$work/missing; mkdir -p "$dir"; port=$(free_port "$python")
start "$dir" "$port" 0 1; p0=$!
wait $p0; rc0=$?
sed 's/^/  missing rank 0: /' "$dir/0.log"
check missing test $rc0 -eq 3 \
  -a "$(lines "$dir/0.log" '^\[ddp info\] \[rank 0/2\] init_process_group: waiting for rank 1 to join \([123] s of 4 s\)$')" = 3 \
  -a "$(lines "$dir/0.log" '^\[ddp info\] \[rank 0/2\] init_process_group: waiting for rank 1 to join \(4 s of 4 s\): giving up$')" = 1 \
  -a "$(lines "$dir/0.log" '^init_exit: rank 0 caught: .*rendezvous timed out.*rank\(s\) \[1\] of 2 never arrived')" = 1

# off
dir=$work/off; mkdir -p "$dir"; port=$(free_port "$python")
start "$dir" "$port" 0 0; p0=$!
start "$dir" "$port" 1 0 "$dir/go"; p1=$!
sleep 1.5
touch "$dir/go"
wait $p0; rc0=$?; wait $p1; rc1=$?
check off test $rc0 -eq 0 -a $rc1 -eq 0 -a "$(lines "$dir/0.log" 'waiting for')" = 0

# bad
dir=$work/bad; mkdir -p "$dir"; port=$(free_port "$python")
start "$dir" "$port" 0 soon; p0=$!
start "$dir" "$port" 1 soon; p1=$!
wait $p0; rc0=$?; wait $p1; rc1=$?
sed 's/^/  bad rank 0: /' "$dir/0.log"
check bad test $rc0 -eq 3 \
  -a "$(lines "$dir/0.log" "^init_exit: rank 0 caught: \[rank 0/2\] init_process_group: DDP_RENDEZVOUS_PROGRESS_S must be a whole number of seconds in \[0, 86400\] \(0: off\), got 'soon'$")" = 1

checks_summary rendezvous_progress
