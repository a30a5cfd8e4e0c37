#!/usr/bin/env bash
# FullyShardedDataParallel with bfloat16 mixed precision against PyTorch's
# own FSDP on the CPU (Gloo): 2 ranks, kFullShard and kShardGradOp, the same
# model, data and 10 SGD steps (pytorch_fsdp_reference.py describes them);
# the full states after training must agree within 1e-3 (seen: 1.6e-4,
# under one bfloat16 step at the weights' size of 0.1: 2^-9 * 0.1 = 2e-4;
# the two sides round the same products, but sum some in other orders).
# Usage:
#   pytorch_fsdp_parity.sh <ddprun> <fsdp_pytorch_parity_main> <python3>
# With a PyTorch older than 2 (Debian's 1.13), whose FSDP does not import on
# Python 3.11, it checks that and says so: the comparison runs in the
# LibTorch 2.11 configuration (scripts/compat.sh), with PyTorch 2.11.
# Prints "pytorch_fsdp_parity: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
ddprun=$1
main=$2
python=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-fsdp-parity.XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

major=$("$python" -c 'import torch; print(torch.__version__.split(".")[0])')
if [ "$major" -lt 2 ]; then
  version=$("$python" -c 'import torch; print(torch.__version__)')
  echo "PyTorch $version: its FullyShardedDataParallel is not run as a reference here"
  check "PyTorch $version's FSDP does not import on this Python (the reason)" \
    bash -c "! '$python' -c 'import torch.distributed.fsdp' >/dev/null 2>&1"
  checks_summary pytorch_fsdp_parity
  exit $?
fi

# compare A B: the largest absolute difference between two state files, or
# a line saying what does not match.
compare() {
  "$python" - "$1" "$2" <<'PY'
import sys
def read(path):
    return {line.split()[0]: [float(v) for v in line.split()[1:]] for line in open(path)}
a, b = read(sys.argv[1]), read(sys.argv[2])
if sorted(a) != sorted(b) or any(len(a[k]) != len(b[k]) for k in a):
    print("names or sizes differ: %s vs %s" % (sorted(a), sorted(b)))
else:
    print("%.3g" % max(abs(x - y) for k in a for x, y in zip(a[k], b[k])))
PY
}

for strategy in full grad-op; do
  "$ddprun" --nproc-per-node 2 --no-prefix "$main" "$work/ddp_$strategy.txt" "$strategy" >"$work/ddp.log" 2>&1 ||
    cat "$work/ddp.log"
  "$ddprun" --nproc-per-node 2 --no-prefix "$python" "$here/pytorch_fsdp_reference.py" \
    "$work/torch_$strategy.txt" "$strategy" >"$work/torch.log" 2>&1 || tail -20 "$work/torch.log"
  difference=$(compare "$work/ddp_$strategy.txt" "$work/torch_$strategy.txt" 2>&1)
  echo "$strategy: largest difference from PyTorch's FSDP: $difference"
  check "$strategy, bf16 parameters and reduction: within 1e-3 of PyTorch's FSDP" \
    "$python" -c "import sys; sys.exit(0 if float('$difference') <= 1e-3 else 1)"
done
checks_summary pytorch_fsdp_parity
