#!/usr/bin/env bash
# The start-up exit sweep (issue: no std::terminate when a rank dies during
# init_process_group). Usage: init_exit_sweep.sh <init_exit_main> <python3>
#
# For 2 and 3 ranks, for each point of start-up (Note [Start-up exit points]:
# store, arrived, gloo-connected, addresses, group; then first-collective and
# ddp in the program), and for rank 0 (the store's server) and the last rank
# as the one that stops: runs the ranks as plain processes (no launcher,
# which would end them all), then checks that the stopped rank exited 86 and
# every other rank printed "caught:" with a message naming its rank, exited
# 3 (not 134, std::terminate's SIGABRT), and did so within 40 s (deadlines
# of 4 s). Prints "init_exit_sweep: N of N cases passed" at the end.
set -uo pipefail
program=$1
python=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-init-exit.XXXXXX")
trap 'rm -rf "$work"' EXIT

. "$(dirname "$0")/../testing/free_port.sh"

# run_case <world> <point> <victim>: one scenario; prints its verdict lines,
# and "PASS <name>" or "FAIL <name>" last.
run_case() {
  local world=$1 point=$2 victim=$3
  local name="world=$world point=$point stopped=rank$victim"
  local dir="$work/$world-$point-$victim"
  mkdir -p "$dir"
  local port
  port=$(free_port "$python")
  local pids=() r
  local start=$SECONDS
  for ((r = 0; r < world; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port DDP_TEST_INIT_EXIT_AT="$point:$victim" OMP_NUM_THREADS=1 \
      timeout -s KILL 60 "$program" >"$dir/$r.log" 2>&1 &
    pids+=($!)
  done
  local ok=1 rc
  for ((r = 0; r < world; r++)); do
    wait "${pids[$r]}"
    rc=$?
    local line
    line=$(grep -m1 '^init_exit: ' "$dir/$r.log")
    if ((r == victim)); then
      if ((rc != 86)); then
        echo "  $name: rank $r (the one to stop) exited $rc, expected 86: $(tail -n 3 "$dir/$r.log")"
        ok=0
      fi
    elif ((rc != 3)) || [[ "$line" != "init_exit: rank $r caught: "*"[rank $r/$world]"* ]]; then
      echo "  $name: rank $r exited $rc (expected 3, a caught error naming [rank $r/$world]); it said: $(tail -n 3 "$dir/$r.log")"
      ok=0
    else
      echo "  $name: rank $r: ${line#init_exit: rank $r caught: }"
    fi
    if grep -q 'terminate called' "$dir/$r.log"; then
      echo "  $name: rank $r called std::terminate: $(grep -m1 'terminate called' "$dir/$r.log")"
      ok=0
    fi
  done
  # The survivors' errors come within a few of the ranks' 4 s deadlines
  # (rendezvous, then Gloo's connect or the first collective); 40 s leaves
  # room for slow starts under sanitizers and a loaded machine, and a hang
  # would be killed at 60 s (exit 137).
  if ((SECONDS - start > 40)); then
    echo "  $name: took $((SECONDS - start)) s, expected the survivors' errors within 40 s (timeout 4 s)"
    ok=0
  fi
  ((ok)) && echo "PASS $name" || echo "FAIL $name"
}

cases=()
for world in 2 3; do
  for point in store arrived gloo-connected addresses group first-collective ddp; do
    for victim in 0 $((world - 1)); do
      cases+=("$world $point $victim")
    done
  done
done

# Three scenarios at a time, each in its own file, printed in order.
index=0
for spec in "${cases[@]}"; do
  # shellcheck disable=SC2086
  run_case $spec >"$work/case.$index.out" 2>&1 &
  index=$((index + 1))
  while (($(jobs -rp | wc -l) >= 3)); do
    wait -n
  done
done
wait
passed=0
for ((i = 0; i < index; i++)); do
  cat "$work/case.$i.out"
  grep -q '^PASS ' "$work/case.$i.out" && passed=$((passed + 1))
done
echo "init_exit_sweep: $passed of $index cases passed"
((passed == index))
