#!/usr/bin/env bash
# DCP directories across world sizes and wrappers, commits that survive a
# kill, and errors on several ranks, in C++ alone (checkpoint_interop_main):
#   - resharding: FSDP at 3 ranks saves, ZeroRedundancyOptimizer at 2 loads
#     and saves, DDP at 4 loads and saves, FSDP at 2 loads; the chain ends
#     within 1e-6 of one uninterrupted run (same batches, same steps);
#   - commits: a save killed at each point of its commit leaves a
#     checkpoint that loads bit for bit: the previous one until `.metadata`
#     is renamed, the new one after; the next save removes what a killed
#     one left;
#   - errors: a rank's file missing, every rank says so, naming it.
# PYTHON (with torch) only compares the final state files.
#
# Usage: dcp_cases.sh <ddprun> <checkpoint_interop_main> <python3>
# Prints "dcp_cases: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
ddprun=$1
main=$2
python=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-dcp-cases.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

interop=$here/interop.py
. "$here/cases_lib.sh"

# ---- Resharding: 3 -> 2 -> 4 -> 2 ranks, FSDP -> ZeRO -> DDP -> FSDP ----
check "uninterrupted: FSDP at 3 ranks, 8 steps" cpp 3 --parallel fsdp --steps 8 --final "$work/uninterrupted.pt"
check "FSDP at 3 ranks: 2 steps, saves" cpp 3 --parallel fsdp --steps 2 --save-dcp "$work/a"
check "ZeRO at 2 ranks: loads, 2 steps, saves" \
  cpp 2 --parallel zero --load-dcp "$work/a" --first-step 2 --steps 2 --save-dcp "$work/b"
check "DDP at 4 ranks: loads, 2 steps, saves" \
  cpp 4 --parallel ddp --load-dcp "$work/b" --first-step 4 --steps 2 --save-dcp "$work/c" --save-torch "$work/c-torch"
check "FSDP at 2 ranks: loads (bit for bit), 2 steps" \
  cpp 2 --parallel fsdp --load-dcp "$work/c" --expect-torch "$work/c-torch" --first-step 6 --steps 2 --final "$work/chain.pt"
check "the chain ends where the uninterrupted run does (within 1e-6)" agree "$work/chain.pt" "$work/uninterrupted.pt"

# ---- Commits ----
# A save to $1 that completes, after which the directory holds its two rank
# files and .metadata, nothing else.
saves_clean() {
  cpp 2 --parallel fsdp --steps 2 --save-dcp "$1" &&
    [ "$(ls -A "$1" | sort | tr '\n' ' ')" = ".metadata __0_$2.distcp __1_$2.distcp " ]
}
# Before each case: a committed save at step 2 (its state also in torch
# format), then the save at step 3 to the same directory, killed at POINT.
for point in dcp-rank-file-partial dcp-rank-file-written dcp-metadata-partial dcp-metadata-written dcp-committed; do
  d=$work/commit-$point
  mkdir -p "$d"
  cpp 2 --parallel fsdp --steps 2 --save-dcp "$d/ckpt" --save-torch "$d/step2" &&
    cpp 2 --parallel fsdp --steps 3 --save-torch "$d/step3" >/dev/null
  DDP_TEST_CHECKPOINT_CRASH_AT=$point "$ddprun" --nproc-per-node 2 "$main" --parallel fsdp --steps 3 \
    --save-dcp "$d/ckpt" >"$d/killed.log" 2>&1
  check "$point: the killed save exits non-zero" test $? -ne 0
  expected=step2
  [ "$point" = dcp-committed ] && expected=step3
  check "$point: the directory loads, bit for bit the $expected save" \
    cpp 2 --parallel fsdp --load-dcp "$d/ckpt" --expect-torch "$d/$expected"
  check "$point: the next save completes and leaves only its own files" saves_clean "$d/ckpt" 2
done

# ---- A rank's file missing: every rank refuses, naming it ----
d=$work/missing
check "FSDP at 2 ranks saves" cpp 2 --parallel fsdp --steps 1 --save-dcp "$d"
rm -f "$d/__1_0.distcp"
"$ddprun" --nproc-per-node 2 "$main" --parallel fsdp --load-dcp "$d" >"$work/missing.log" 2>&1
check "a load with a rank's file missing fails" test $? -ne 0
check "both ranks name the missing file" \
  test "$(grep -c "__1_0.distcp', a file the checkpoint's metadata names, is missing" "$work/missing.log")" -eq 2
checks_summary dcp_cases
