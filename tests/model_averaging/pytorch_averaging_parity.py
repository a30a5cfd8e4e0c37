"""Parity of PeriodicModelAverager and HierarchicalModelAverager with
PyTorch's (Gloo, on the CPU): the same schedules on 2, 3 and 4 ranks, in
averaging_main --dump (ddp) and in this file's reference role (PyTorch);
every rank's parameters after each call must be equal (tolerance 1e-12: one
allreduce of the same values). Fails (does not skip) without torch.

Usage (registered with CTest as averaging_pytorch_parity):
  /usr/bin/python3 tests/model_averaging/pytorch_averaging_parity.py --ddprun build/ddprun \\
      --ours build/tests/averaging_main --python /usr/bin/python3
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "comm"))
import pytorch_objects_parity as shared  # noqa: E402


def params_at(rank, step):
    import torch
    # averaging_main.cpp's params_at, spelled in Python.
    # (Parameters: PyTorch's averagers take a module's parameters or an
    # optimizer's parameter groups, not plain tensors.)
    # With gradients: the averagers skip parameters without one.
    v = (rank + 1.0) * (step + 1)
    params = [torch.nn.Parameter(torch.full((2, 3), v)),
              torch.nn.Parameter(torch.full((4,), v, dtype=torch.double))]
    for p in params:
        p.grad = torch.zeros_like(p)
    return params


def reference(prefix):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager)
    from collections import OrderedDict

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    averager = PeriodicModelAverager(period=3, warmup_steps=2)
    periodic = []
    for step in range(10):
        params = params_at(rank, step)
        averager.average_parameters(params)
        periodic.append([p.detach() for p in params])
    out["periodic"] = periodic
    # PyTorch 1.13's new_subgroups refuses to run without CUDA, and so does
    # its HierarchicalModelAverager: compared with PyTorch 2.x only (None).
    out["hierarchical"] = None
    if int(torch.__version__.split(".")[0]) >= 2:
        half = max(world // 2, 1)
        averager = HierarchicalModelAverager(OrderedDict([(2, half), (4, world)]), warmup_steps=1)
        out["hierarchical"] = []
        for step in range(9):
            params = params_at(rank, step)
            averager.average_parameters(params)
            out["hierarchical"].append([p.detach() for p in params])
    torch.save(out, "%s.rank%d.pt" % (prefix, rank))
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = shared.parse_args(__doc__)
    if args.reference:
        reference(args.reference)
        return 0
    def prepare(ours, theirs):
        if theirs.get("hierarchical", 0) is None:
            del ours["hierarchical"], theirs["hierarchical"]
            print("PyTorch < 2 runs no HierarchicalModelAverager on the CPU (its new_subgroups needs CUDA): "
                  "compared with PyTorch 2.x only")

    return shared.driver(args, os.path.abspath(__file__), "averaging_pytorch_parity", (2, 3, 4),
                         "PeriodicModelAverager (and, with PyTorch 2.x, HierarchicalModelAverager), every step,",
                         prepare)


if __name__ == "__main__":
    sys.exit(main())
