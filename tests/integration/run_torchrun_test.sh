#!/bin/sh
# Runs toy_model with 2 ranks under PyTorch's launcher, torchrun, and checks
# that both ranks trained in one world of 2 and agreed.
#
# Usage: run_torchrun_test.sh MODE TOY_MODEL PYTHON [TORCHRUN...]
#   MODE       static (torchrun's default rendezvous, on a free --master_port),
#              standalone (--standalone), or c10d (--rdzv_backend c10d on a
#              free port of localhost)
#   PYTHON     an interpreter; picks the free port, and runs
#              `PYTHON -m torch.distributed.run` when no TORCHRUN is given
#   TORCHRUN   the launcher's command. DDP_TEST_TORCHRUN in the environment
#              replaces it (e.g. to try another PyTorch without reconfiguring).
# Flags are spelled with underscores, which every torchrun accepts (PyTorch
# 1.13's knows no other spelling). Exits 77 (skipped) when the launcher
# cannot run at all, else with toy_model's outcome.
set -u
mode=$1
toy_model=$2
python=$3
shift 3
if [ -n "${DDP_TEST_TORCHRUN:-}" ]; then
  set -- "$DDP_TEST_TORCHRUN"
elif [ $# -eq 0 ]; then
  set -- "$python" -m torch.distributed.run
fi

if ! "$@" --help >/dev/null 2>&1; then
  echo "skipped: '$*' cannot run (no PyTorch with torch.distributed.run?)"
  exit 77
fi
# PyTorch 1.x's launcher (which knows no dashed flags) cannot parse its own
# default --redirects and --tee ('0') on Python 3.11 and later, where
# enum.Flag no longer iterates its zero member: it fails before starting any
# rank ('NoneType' object has no attribute 'get'). '2' (stderr, to a log file
# and to the console) is a value it can parse.
if ! "$@" --help 2>&1 | grep -q -- --nproc-per-node; then
  set -- "$@" --redirects 2 --tee 2
fi
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') || exit 1

case $mode in
  static) set -- "$@" --master_port "$port" ;;
  standalone) set -- "$@" --standalone ;;
  c10d) set -- "$@" --rdzv_backend c10d --rdzv_endpoint "localhost:$port" ;;
  *) echo "unknown mode '$mode'"; exit 2 ;;
esac

output=$(mktemp)
trap 'rm -f "$output"' EXIT
echo "+ OMP_NUM_THREADS=1 $* --nproc_per_node 2 --no_python $toy_model"
OMP_NUM_THREADS=1 "$@" --nproc_per_node 2 --no_python "$toy_model" >"$output" 2>&1
status=$?
cat "$output"
if [ $status -ne 0 ]; then
  echo "FAILED: torchrun exited with $status"
  exit 1
fi
# Exit 0 alone would also come from two worlds of 1: check that it was one of 2.
for line in "rank 0 of 2" "rank 1 of 2" "parameters agree across 2 ranks"; do
  if ! grep -q "$line" "$output"; then
    echo "FAILED: no line with '$line' in the output"
    exit 1
  fi
done
echo "OK: toy_model trained under torchrun ($mode)"
