#!/usr/bin/env bash
# Labels of ddp's own collectives in mismatch errors and flight recorder
# dumps (labels_main.cpp says what each case does).
# Usage: labels_cases.sh <ddprun> <labels_main>
# Prints "labels_cases: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
ddprun=$1
main=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-labels.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

# run MODE: both ranks' output in $work/MODE.log, dumps in $work/MODE/.
run() {
  DDP_FLIGHT_RECORDER_DIR=$work/$1 "$ddprun" --nproc-per-node 2 "$main" "$1" >"$work/$1.log" 2>&1
  cat "$work/$1.log"
}
# on_both LOG TEXT: both ranks' caught error holds TEXT.
on_both() {
  [ "$(grep '^\[rank [01]\]: labels_main: caught: ' "$1" | grep -cF "$2")" = 2 ]
}

run syncbn-vs-ddp
check "SyncBatchNorm against DDP: both ranks see a mismatch" on_both "$work/syncbn-vs-ddp.log" "called"
check "the error names the SyncBatchNorm layer's forward" on_both "$work/syncbn-vs-ddp.log" "(SyncBatchNorm '1' forward)"
check "the error names DDP's buffer broadcast" on_both "$work/syncbn-vs-ddp.log" "(DDP buffer broadcast)"
check "rank 0's flight recorder dump records the label" \
  grep -qF '"label": "SyncBatchNorm '"'"'1'"'"' forward"' "$work/syncbn-vs-ddp/rank_0.json"

run zero-vs-fsdp
check "ZeRO against FSDP: both ranks see a mismatch" on_both "$work/zero-vs-fsdp.log" "called"
check "the error names ZeRO's step" on_both "$work/zero-vs-fsdp.log" "(ZeRO step: rank"
check "the error names FSDP's unit gather" on_both "$work/zero-vs-fsdp.log" "(FSDP unit child 0 all-gather)"
checks_summary labels_cases
