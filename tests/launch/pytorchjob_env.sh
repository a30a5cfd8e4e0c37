#!/usr/bin/env bash
# toy_model as Kubeflow's PyTorchJob runs it (docs/launcher.md, "Kubernetes
# (PyTorchJob)"): one process per pod, each given only MASTER_ADDR (the
# master replica's service), MASTER_PORT, WORLD_SIZE and RANK by the
# operator, and LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 by the container's env, as
# the docs say to add. Both "pods" run on this machine. Usage:
#   pytorchjob_env.sh <toy_model> <python3>
# Prints "pytorchjob_env: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/free_port.sh"
. "$here/../testing/checks.sh"
toy_model=$1
python=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-pytorchjob.XXXXXX")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
port=$(free_port "$python")
pids=()
for rank in 0 1; do
  # env -i: nothing of this shell's launcher variables, as in a fresh pod.
  env -i PATH="$PATH" HOME="$HOME" TMPDIR="$work" OMP_NUM_THREADS=1 \
    MASTER_ADDR=localhost MASTER_PORT="$port" WORLD_SIZE=2 RANK=$rank \
    LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "$toy_model" >"$work/$rank.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  wait "$pid" || rc=1
done
for rank in 0 1; do
  sed "s/^/  pod $rank: /" "$work/$rank.log"
  check "pod $rank: rank $rank of 2, local rank 0 of 1, trained and agreed" \
    test "$(grep -cE "^toy_model: rank $rank of 2 \(local rank 0 of 1\) on cpu" "$work/$rank.log")" = 1 \
    -a "$(grep -cE '^checkpoint: parameters agree across 2 ranks \(max difference 0\)$' "$work/$rank.log")" = 1
done
check "both pods exited 0" test $rc = 0
checks_summary pytorchjob_env
