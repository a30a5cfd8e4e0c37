"""Writes the PyTorch flight recorder dumps (JSON form) that
flight_recorder_cases.sh reads back with `ddprun --analyze`: two ranks on
Gloo run all_reduce #1 .. #5 of 4 floats, then
  skip: rank 0 issues all_reduce #6, rank 1 never does;
  size: rank 0 issues #6 with 4 floats, rank 1 a second later with 8;
        each writes its dump right after issuing it, before the transfer
        (Gloo aborts the receiving rank's process on the mismatch, so
        torchrun reports a failure: the dumps are written by then);
and each rank writes torch._C._distributed_c10d._dump_fr_trace_json() to
DIR/<case>/nccl_trace_rank_<R> (PyTorch's default file name).

Made with PyTorch 2.11.0 (the wheel of scripts/compat.sh):
  TORCH_FR_BUFFER_SIZE=100 torchrun --nproc-per-node 2 make_dumps.py skip DIR
  TORCH_FR_BUFFER_SIZE=100 torchrun --nproc-per-node 2 make_dumps.py size DIR
"""

import os
import sys
import time

import torch
import torch._C._distributed_c10d as c10d_ext
import torch.distributed as dist


def main():
    case, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    os.makedirs(os.path.join(out, case), exist_ok=True)
    if case == "size":
        if rank == 1:
            time.sleep(1)
        dist.all_reduce(torch.ones(8 if rank == 1 else 4), async_op=True)
    elif rank == 0:
        dist.all_reduce(torch.ones(4), async_op=True)
    if case == "skip":
        time.sleep(1)
    with open(os.path.join(out, case, "nccl_trace_rank_%d" % rank), "wb") as f:
        f.write(c10d_ext._dump_fr_trace_json(True, True))
    if case == "size" and rank == 0:
        time.sleep(3)  # until rank 1 has written its dump
    sys.stdout.flush()
    os._exit(0)  # the mismatched collective would never complete


if __name__ == "__main__":
    main()
