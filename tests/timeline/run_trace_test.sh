#!/bin/sh
# The timeline of a real job: examples/mnist on 2 ranks under
# `ddprun --trace DIR`, with DDP_DEBUG=1 so that rank 0 prints DDP's insight
# of each iteration. check_trace.py then checks the merged trace against the
# Trace Event Format's rules and against that insight, and the picture.
#
#   run_trace_test.sh DDPRUN MNIST_TRAIN PYTHON WORK_DIR
set -eu
if [ $# -ne 4 ]; then
  echo "usage: $0 DDPRUN MNIST_TRAIN PYTHON WORK_DIR" >&2
  exit 2
fi
ddprun=$1
train=$2
python=$3
work=$4
rm -rf "$work"
mkdir -p "$work"

# One short epoch; the timeline keeps its last 5 steps. 16 KiB buckets: the
# model's 87 KB of gradients in 6 of them, so that some are reduced while
# backward still computes.
echo "+ DDP_DEBUG=1 DDP_TRACE_STEPS=5 ddprun --nproc-per-node 2 --trace $work/trace mnist_train --epochs 1 --bucket-cap-mb 0.015625 ..."
if ! DDP_DEBUG=1 DDP_TRACE_STEPS=5 "$ddprun" --nproc-per-node 2 --trace "$work/trace" \
    "$train" --epochs 1 --train-size 640 --test-size 128 --bucket-cap-mb 0.015625 >"$work/run.log" 2>&1; then
  cat "$work/run.log"
  echo "FAIL: mnist_train under ddprun --trace exited with an error"
  exit 1
fi
grep '^ddprun: timeline' "$work/run.log" || { cat "$work/run.log"; echo "FAIL: ddprun did not say where the timeline is"; exit 1; }
for file in trace_rank_0.json trace_rank_1.json trace.json trace.svg; do
  [ -s "$work/trace/$file" ] || { echo "FAIL: no $work/trace/$file"; exit 1; }
done
"$python" "$(dirname "$0")/check_trace.py" "$work/trace" "$work/run.log" 2
