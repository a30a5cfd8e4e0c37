#!/usr/bin/env bash
# Runs every GPU check of docs/gpu.md on a machine with a GPU, in order, and
# prints a summary line per step.
#
# Usage: bash tests/gpu/verify.sh BUILD_DIR [PYTHON]
#
#   BUILD_DIR  a build configured with -DDDP_WITH_NCCL=ON (docs/gpu.md)
#   PYTHON     an interpreter whose torch has CUDA, for PyTorch's side of the
#              benchmark (default: python3)
#
# Steps: the CTest tests labelled gpu; DDP, ZeroRedundancyOptimizer and
# FullyShardedDataParallel parity on CUDA with 2 ranks under ddprun (Gloo;
# NCCL when there are 2 GPUs); the ToyModel example alone on the GPU; the
# side-by-side DDP step benchmark (bench/gpu/run_ddp_step_bench.py), the cost
# of the NCCL fingerprint check, ZeRO's step against PyTorch's
# ZeroRedundancyOptimizer (bench/zero_bench.cpp --device cuda,
# bench/gpu/zero_step_bench.py) and FSDP's against PyTorch's FSDP
# (bench/fsdp_bench.cpp --device cuda, bench/gpu/fsdp_step_bench.py).
# DDP_VERIFY_LARGEST=1 adds the largest GPT that the GPU trains, against
# PyTorch (bench/gpu/gpt_largest.py). DDP_VERIFY_BENCH=0 leaves the benchmarks out; DDP_VERIFY_ROUNDS=R sets
# their rounds (default 3); DDP_VERIFY_VERBOSE=1 shows every GPU test's
# output (ctest -V), not only a failed one's. Exits non-zero when a check
# fails; benchmark ratios never fail it.
set -uo pipefail

build=${1:?usage: bash tests/gpu/verify.sh BUILD_DIR [PYTHON]}
python=${2:-python3}
rounds=${DDP_VERIFY_ROUNDS:-3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
failed=0

step() {
  echo
  echo "==== $*"
}

check() {
  local name=$1
  shift
  if "$@"; then
    echo "verify.sh: PASS $name"
  else
    echo "verify.sh: FAIL $name (exit code $?)"
    failed=1
  fi
}

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' || true

step "CTest, label gpu"
verbose=()
[[ ${DDP_VERIFY_VERBOSE:-0} == 1 ]] && verbose=(-V)
check ctest-gpu ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300 "${verbose[@]}"

step "DDP, ZeRO and FSDP parity on CUDA, 2 ranks"
for program in gpu_ddp_parity_main gpu_zero_parity_main gpu_fsdp_parity_main; do
  for backend in gloo nccl; do
    "$build/ddprun" --nproc-per-node 2 "$build/tests/$program" "$backend"
    rc=$?
    if [[ $rc -eq 77 ]]; then
      echo "verify.sh: SKIP $program $backend (needs more GPUs)"
    elif [[ $rc -eq 0 ]]; then
      echo "verify.sh: PASS $program $backend"
    else
      echo "verify.sh: FAIL $program $backend (exit code $rc)"
      failed=1
    fi
  done
done

step "ToyModel example, alone, on the GPU"
check toy_model-alone "$build/examples/toy_model"

if [[ ${DDP_VERIFY_BENCH:-1} != 0 ]]; then
  step "DDP step benchmark against PyTorch DDP"
  check step-bench "$python" "$root/bench/gpu/run_ddp_step_bench.py" "$build" --python "$python" --rounds "$rounds"
  # zero: against PyTorch's ZeroRedundancyOptimizer; fsdp: against its
  # FullyShardedDataParallel.
  for bench in zero fsdp; do
    step "$bench step against PyTorch's (NCCL 1 rank, Gloo 2 ranks)"
    for config in nccl:1 gloo:2; do
      backend=${config%%:*}
      nproc=${config##*:}
      check "$bench-bench-$backend" "$build/ddprun" --nproc-per-node "$nproc" --no-prefix \
        "$build/bench/${bench}_bench" --mode speed --device cuda --backend "$backend" --batch 512 --rounds "$rounds"
      check "$bench-bench-torch-$backend" "$build/ddprun" --nproc-per-node "$nproc" --no-prefix "$python" \
        "$root/bench/gpu/${bench}_step_bench.py" --mode speed --backend "$backend" --batch 512 --rounds "$rounds"
    done
  done
  # With one rank DDP sends nothing unless asked (--communicate-alone 1).
  step "The NCCL fingerprint check's cost, forced on at one rank (alternating rounds)"
  for model in "--model toy --batch 20" "--model mlp --width 2500 --layers 4 --batch 4096"; do
    for round in $(seq "$rounds"); do
      for check_mode in off on; do
        # shellcheck disable=SC2086 # $model holds several flags
        echo "check=$check_mode round=$round: $(DDP_NCCL_COLLECTIVE_CHECK=$check_mode \
          "$build/bench/gpu_ddp_step_bench" --backend nccl --communicate-alone 1 $model 2>&1 | tail -n 1)"
      done
    done
  done
fi

# The largest GPT one GPU trains (DDP; FSDP with activation checkpointing;
# with CPU offload) and its speed against PyTorch's on the same model: about
# 15 minutes on an H200 (most of it ddp building billions of parameters on
# the host), so only when asked.
if [[ ${DDP_VERIFY_LARGEST:-0} == 1 ]]; then
  step "The largest GPT on this GPU, against PyTorch (bench/gpu/gpt_largest.py)"
  check gpt-largest "$python" "$root/bench/gpu/gpt_largest.py" "$build" --python "$python"
fi

echo
if [[ $failed -eq 0 ]]; then
  echo "verify.sh: all GPU checks passed"
else
  echo "verify.sh: some GPU checks FAILED"
fi
exit "$failed"
