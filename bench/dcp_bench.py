"""PyTorch's side of bench/dcp_bench.cpp: torch.distributed.checkpoint's save
and load of the same model (Sequential of LAYERS Linear(WIDTH, WIDTH), FSDP2's
fully_shard on each layer and the root, Adam with its state made by one
step), timed and measured the same way, one line per round and rank:
  dcp_bench impl=torch world=2 params=... rank=R round=K save_s=... load_s=... save_extra_mb=... load_extra_mb=...

Usage (under ddprun or torchrun):
  dcp_bench.py --dir DIR [--width 4096] [--layers 8] [--rounds 3]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def status_mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024.0
    return -1.0


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    params = sum(q.numel() for q in net.parameters())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in net:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    adam = torch.optim.Adam(net.parameters(), lr=1e-4)
    net(torch.randn(2, args.width)).sum().backward()
    adam.step()
    for round in range(args.rounds):
        def timed(body):
            dist.barrier()
            before = status_mb("VmRSS:")
            reset_peak()
            start = time.perf_counter()
            body()
            mine = time.perf_counter() - start
            extra = status_mb("VmHWM:") - before
            slowest = torch.tensor([mine], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            return slowest.item(), extra

        def save():
            model, optim = get_state_dict(net, adam)
            dcp.save({"model": model, "optim": optim}, checkpoint_id=args.dir)

        def load():
            model, optim = get_state_dict(net, adam)
            state = {"model": model, "optim": optim}
            dcp.load(state, checkpoint_id=args.dir)
            set_state_dict(net, adam, model_state_dict=state["model"], optim_state_dict=state["optim"])

        save_s, save_extra = timed(save)
        load_s, load_extra = timed(load)
        print("dcp_bench impl=torch world=%d params=%d rank=%d round=%d save_s=%.3f load_s=%.3f "
              "save_extra_mb=%.1f load_extra_mb=%.1f"
              % (dist.get_world_size(), params, dist.get_rank(), round, save_s, load_s, save_extra, load_extra),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
