#!/usr/bin/env bash
# Checkpoints written on CUDA, read by PyTorch on CUDA and on the CPU, and
# the reverse (docs/gpu.md): checkpoint_interop_main (ddp) and interop.py
# (PyTorch) train tests/checkpoint's model on the GPU. For each format the
# loading side takes one more step, which must agree with the saving side's
# own next step within 1e-5 (GPU kernels may round otherwise than the CPU's;
# in practice the sides agree to 1e-7).
#   - DDP alone on cuda:0 over NCCL saves torch.save files, DCP and
#     safetensors; PyTorch loads the torch.save files on CUDA and with
#     map_location="cpu", the DCP directory alone on CUDA, on the CPU, and
#     into FSDP2 (fully_shard) over NCCL; safetensors loads.
#   - FSDP with 2 Gloo ranks sharing cuda:0 saves DCP and torch.save files;
#     PyTorch loads the DCP directory into FSDP2 on CUDA.
#   - PyTorch's FSDP2 on CUDA saves DCP; ddp's FSDP on cuda:0 over NCCL and
#     ZeroRedundancyOptimizer over 2 Gloo ranks sharing cuda:0 load it, bit
#     for bit against PyTorch's torch.save of the same state.
# Exits 77 (a skip, saying why) without a CUDA device.
#
# Usage: checkpoint_cuda.sh <ddprun> <checkpoint_interop_main> <python3>
# Prints "checkpoint_cuda: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
. "$here/../testing/free_port.sh"
ddprun=$1
main=$2
python=$3
interop=$here/../checkpoint/interop.py
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "checkpoint_cuda: skipped: no CUDA device (or $python's torch has no CUDA): these checks need a GPU"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-checkpoint-cuda.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
. "$here/../checkpoint/cases_lib.sh"
py() {
  local n=$1
  shift
  if [ "$n" -eq 0 ]; then
    quietly "$python" "$interop" run --parallel plain "$@"
  else
    quietly "$python" -m torch.distributed.run --nproc_per_node "$n" --master_port "$(free_port "$python")" \
      "$interop" run "$@"
  fi
}
# PyTorch loads $1/$2 (torch or dcp) with ARGS, one step, against $1/final.pt.
py_loads() {
  local d=$1 format=$2 n=$3 out
  shift 3
  out=$(mktemp "$d/py.XXXXXX.pt")
  py "$n" "--load-$format" "$d/$format" --first-step 3 --then-steps 1 --final "$out" "$@" &&
    agree "$out" "$d/final.pt" 1e-5
}

d=$work/ddp
mkdir -p "$d"
check "DDP on cuda:0 over NCCL saves torch.save files, DCP and safetensors" \
  cpp 1 --parallel ddp --device cuda --backend nccl --steps 3 --save-torch "$d/torch" --save-dcp "$d/dcp" \
    --save-safetensors "$d/model.safetensors" --then-steps 1 --final "$d/final.pt"
check "PyTorch loads the torch.save files on CUDA, the next step agrees" py_loads "$d" torch 0 --device cuda
check "PyTorch loads them with map_location=cpu, on the CPU, the next step agrees" \
  py_loads "$d" torch 0 --device cpu --map-location cpu
check "PyTorch loads the DCP directory alone on CUDA (bit for bit), the next step agrees" \
  py_loads "$d" dcp 0 --device cuda --expect-torch "$d/torch"
check "PyTorch loads the DCP directory alone on the CPU, the next step agrees" py_loads "$d" dcp 0 --device cpu
check "PyTorch's FSDP2 on CUDA (NCCL) loads the DCP directory, the next step agrees" \
  py_loads "$d" dcp 1 --parallel fsdp2 --device cuda
check "the safetensors file holds the state dict's tensors" \
  quietly "$python" "$interop" safetensors "$d/model.safetensors" "$d/torch/model.pt"

d=$work/fsdp
mkdir -p "$d"
check "FSDP with 2 Gloo ranks sharing cuda:0 saves DCP and torch.save files" \
  cpp 2 --parallel fsdp --device cuda:0 --backend gloo --steps 3 --save-torch "$d/torch" --save-dcp "$d/dcp" \
    --then-steps 1 --final "$d/final.pt"
check "PyTorch's FSDP2 on CUDA loads it, the next step agrees" py_loads "$d" dcp 1 --parallel fsdp2 --device cuda
check "PyTorch loads its torch.save files on the CPU, the next step agrees" \
  py_loads "$d" torch 0 --device cpu --map-location cpu

d=$work/fsdp2
mkdir -p "$d"
check "PyTorch's FSDP2 on CUDA saves DCP (and torch.save files of the same state)" \
  py 1 --parallel fsdp2 --device cuda --steps 3 --save-dcp "$d/dcp" --save-torch "$d/torch" --then-steps 1 \
    --final "$d/final.pt"
check "ddp's FSDP on cuda:0 over NCCL loads it bit for bit, the next step agrees" \
  bash -c "'$ddprun' --nproc-per-node 1 '$main' --parallel fsdp --device cuda --backend nccl --load-dcp '$d/dcp' \
    --expect-torch '$d/torch' --first-step 3 --then-steps 1 --final '$d/cpp-fsdp.pt' >'$d/fsdp.log' 2>&1 &&
    '$python' '$interop' compare '$d/cpp-fsdp.pt' '$d/final.pt' 1e-5 || { tail -20 '$d/fsdp.log'; false; }"
check "ddp's ZeRO with 2 Gloo ranks sharing cuda:0 loads it bit for bit, the next step agrees" \
  bash -c "'$ddprun' --nproc-per-node 2 '$main' --parallel zero --device cuda:0 --backend gloo --load-dcp '$d/dcp' \
    --expect-torch '$d/torch' --first-step 3 --then-steps 1 --final '$d/cpp-zero.pt' >'$d/zero.log' 2>&1 &&
    '$python' '$interop' compare '$d/cpp-zero.pt' '$d/final.pt' 1e-5 || { tail -20 '$d/zero.log'; false; }"
checks_summary checkpoint_cuda
