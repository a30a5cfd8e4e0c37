#!/usr/bin/env bash
# Sharded checkpoints of FullyShardedDataParallel (docs/ddp.md, "Fully
# sharded data parallel"): a resumed run equals an uninterrupted one, a
# checkpoint of 2 ranks loads on 3 through a full state and in one process,
# and a save killed at each point of the set's commit leaves the previous
# save or the new one, whole, with the next save removing what it left.
# Usage:
#   sharded_checkpoint_cases.sh <ddprun> <fsdp_checkpoint_main>
# Prints "sharded_checkpoint_cases: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
ddprun=$1
main=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-sharded-checkpoint.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

# run NPROC ARGS...: the digest rank 0 printed, or "failed".
run() {
  local nproc=$1
  shift
  local out
  if out=$("$ddprun" --nproc-per-node "$nproc" --no-prefix "$main" "$@" 2>"$work/stderr"); then
    echo "$out" | sed -n 's/^digest //p'
  else
    cat "$work/stderr" >&2
    echo failed
  fi
}

alone() {
  "$main" full "$1" 2>&1 | sed -n 's/^digest //p'
}

p=$work/ckpt
uninterrupted=$(run 2 save "$work/straight" 5)
saved=$(run 2 save "$p" 3)
resumed=$(run 2 resume "$p" 2)
echo "uninterrupted $uninterrupted, saved after 3 steps $saved, resumed to 5 $resumed"
check "a run resumed from a sharded checkpoint (with Adam's state) ends as an uninterrupted one" \
  test "$resumed" = "$uninterrupted" -a "$resumed" != failed
check "the set is a manifest and one file per rank" \
  test "$(ls "$work" | grep -cE '^ckpt\.[0-9a-f]{16}\.rank[01]$')" = 2
check "its full state, read in one process, is the saved state" test "$(alone "$p")" = "$saved"
check "it loads on 3 ranks through a full state" test "$(run 3 load-full "$p")" = "$saved"
check "resuming on 3 ranks from a 2-rank set is refused, naming the way" \
  bash -c "'$ddprun' --nproc-per-node 3 --no-prefix '$main' resume '$p' 1 2>&1 | grep -q 'written on 2 ranks and this job has 3'"

# Killed at each point of a new save over $p (every rank dies at the point).
five=$(run 2 save "$work/five" 5)
for point in sharded-rank-file sharded-manifest sharded-committed; do
  DDP_TEST_CHECKPOINT_CRASH_AT=$point "$ddprun" --nproc-per-node 2 --no-prefix "$main" save "$p" 5 \
    >/dev/null 2>&1
  got=$(alone "$p")
  if [ "$point" = sharded-committed ]; then
    check "killed after the commit ($point): the new save, whole" test "$got" = "$five"
    check "  the files of the killed saves are still there" \
      test "$(ls "$work" | grep -cE '^ckpt\.[0-9a-f]{16}\.rank[01]$')" -gt 2
  else
    check "killed at $point: the previous save, whole" test "$got" = "$saved"
  fi
done
check "the next save removes every file of other saves" \
  bash -c "[ \"\$('$ddprun' --nproc-per-node 2 --no-prefix '$main' save '$p' 5 2>/dev/null | sed -n 's/^digest //p')\" = '$five' ] &&
           [ \"\$(ls '$work' | grep -cE '^ckpt\\.[0-9a-f]{16}\\.rank[01]\$')\" = 2 ] &&
           [ \"\$(ls '$work' | grep -c '^ckpt\\.tmp\\.')\" = 0 ]"

# A damaged rank file is named, not loaded.
victim=$(ls "$work" | grep -E '^ckpt\.[0-9a-f]{16}\.rank1$')
printf 'x' >>"$work/$victim"
check "a damaged rank file is refused, naming it" \
  bash -c "'$main' full '$p' 2>&1 | grep -q \"'$work/$victim' does not match the manifest\""
checks_summary sharded_checkpoint_cases
