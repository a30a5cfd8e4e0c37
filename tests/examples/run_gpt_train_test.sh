#!/bin/sh
# gpt_train against its PyTorch twin (examples/gpt/gpt.py) on the same
# initial weights and batches: each step's loss, mean over the ranks, equals
# the one-process PyTorch run's on the whole batch (1e-4), for 20 steps of
# DDP, ZeRO, FSDP, FSDP with activation checkpointing and FSDP with
# deferred construction (--meta-init) on 2 ranks; and a DCP checkpoint
# written after 10 steps resumes to the 20-step run's losses; a malformed
# --checkpoint-dir is refused with an error naming its file.
#
# Usage: run_gpt_train_test.sh DDPRUN GPT_TRAIN GPT_PY PYTHON WORKDIR
set -eu
ddprun=$1 train=$2 gpt_py=$3 python=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
# A small model: 2 layers, 64 wide, block 64, 4 sequences per rank.
model="--layers 2 --heads 4 --embd 64 --block 64 --batch 4 --sample 40 --log-every 10"

"$ddprun" --nproc-per-node 2 "$train" $model --steps 20 --parallel ddp \
  --save-initial "$work/init.pt" --losses "$work/ddp.txt" > "$work/ddp.log" 2>&1 || {
  cat "$work/ddp.log"; echo "FAILED: gpt_train --parallel ddp"; exit 1; }
grep -q 'sample: "The ' "$work/ddp.log" || { cat "$work/ddp.log"; echo "FAILED: no sample"; exit 1; }
grep -q 'tokens/s' "$work/ddp.log" || { cat "$work/ddp.log"; echo "FAILED: no tokens/s"; exit 1; }

# The reference: PyTorch, one process, the global batch of 8.
"$python" "$gpt_py" --layers 2 --heads 4 --embd 64 --block 64 --batch 8 --steps 20 \
  --init "$work/init.pt" --losses "$work/pytorch.txt" > "$work/pytorch.log" 2>&1 || {
  cat "$work/pytorch.log"; echo "FAILED: gpt.py"; exit 1; }

run() { # name, flags...
  name=$1; shift
  "$ddprun" --nproc-per-node 2 "$train" $model "$@" > "$work/$name.log" 2>&1 || {
    cat "$work/$name.log"; echo "FAILED: gpt_train $*"; exit 1; }
}
run zero --steps 20 --parallel zero --losses "$work/zero.txt"
run fsdp --steps 20 --parallel fsdp --losses "$work/fsdp.txt"
run fsdp_ac --steps 20 --parallel fsdp --activation-checkpointing --losses "$work/fsdp_ac.txt"
run ddp_ac --steps 20 --parallel ddp --activation-checkpointing --losses "$work/ddp_ac.txt"
# Built block by block, each rank keeping its shards: the same weights.
run fsdp_meta --steps 20 --parallel fsdp --meta-init --activation-checkpointing --losses "$work/fsdp_meta.txt"
# Interrupted after 10 steps, resumed from its DCP checkpoint for 10 more.
run first_half --steps 10 --parallel fsdp --activation-checkpointing --checkpoint "$work/ckpt"
run second_half --steps 20 --parallel fsdp --activation-checkpointing --checkpoint "$work/ckpt" --resume \
  --losses "$work/resumed.txt"

checks=0
compare() { # file, reference, first line (1-based), tolerance
  if ! awk -v tol="$4" -v first="$3" '
      NR == FNR { ref[FNR] = $1; n = FNR; next }
      { i = FNR + first - 1; d = $1 - ref[i]; if (d < 0) d = -d; if (d > worst) worst = d; count++ }
      END { printf "%s: %d steps, largest difference %.3g (tolerance %s)\n", FILENAME, count, worst, tol;
            exit !(count > 0 && worst <= tol) }' "$2" "$1"; then
    echo "FAILED: $1 differs from $2"; exit 1
  fi
  checks=$((checks + 1))
}
for mode in ddp zero fsdp fsdp_ac ddp_ac fsdp_meta; do
  compare "$work/$mode.txt" "$work/pytorch.txt" 1 1e-4
done
# Activation checkpointing changes nothing: the same losses as without.
compare "$work/fsdp_ac.txt" "$work/fsdp.txt" 1 1e-6
compare "$work/fsdp_meta.txt" "$work/fsdp.txt" 1 1e-6
# Steps 11..20 after the resume: the uninterrupted run's (--steps 20
# continues from the checkpoint's step count: the losses file holds 11..20).
compare "$work/resumed.txt" "$work/fsdp_ac.txt" 11 1e-6
# --checkpoint-dir whose `latest` is malformed: an error naming the file,
# on rank 0, and the other rank pointing at it; no training over it.
mkdir -p "$work/bad_dir"
printf 'checkpoint step-7\ncompleted_steps 8\n' > "$work/bad_dir/latest"
if "$ddprun" --nproc-per-node 2 "$train" $model --steps 3 --checkpoint-dir "$work/bad_dir" \
    > "$work/bad_dir.log" 2>&1; then
  cat "$work/bad_dir.log"; echo "FAILED: a malformed latest was accepted"; exit 1
fi
grep -q "bad_dir/latest: expected the lines 'checkpoint step-S' and 'completed_steps S'" "$work/bad_dir.log" &&
  grep -q "rank 0 could not start from --checkpoint-dir" "$work/bad_dir.log" || {
  cat "$work/bad_dir.log"; echo "FAILED: the malformed latest's errors"; exit 1; }
checks=$((checks + 1))
echo "gpt_train: $checks of $checks checks passed"
