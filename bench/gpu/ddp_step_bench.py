"""Time of one DistributedDataParallel training step on CUDA: PyTorch's own
DDP, the reference half of bench/gpu/ddp_step_bench.cpp, with the same
model, batch and methodology (see that file).

Usage:
  build/ddprun --nproc-per-node 2 --no-prefix /usr/bin/python3 bench/gpu/ddp_step_bench.py \
      [--backend nccl|gloo] [--model mlp|toy] [--width 4096] [--layers 4] [--batch 64] [--iters 50] [--warmup 10]
(torchrun --nproc-per-node 2 works too) prints on rank 0 one line
  ddp_step_bench impl=torch model=mlp backend=nccl world=2 params=67125248 batch=64 warmup=10 iters=50 median_ms=... p10_ms=... p90_ms=...
and exits 0; 77 without a GPU.
"""

import argparse
import os
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--model", choices=("mlp", "toy"), default="mlp")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    return parser.parse_args()


def percentile(values, fraction):
    ordered = sorted(values)
    index = min(int(fraction * (len(ordered) - 1) + 0.5), len(ordered) - 1)
    return ordered[index]


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not torch.cuda.is_available():
        print("no CUDA device: NCCL tests need a GPU")
        return 77
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device_index = local_rank % torch.cuda.device_count()
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend)

    torch.manual_seed(0)
    layers = []
    in_features = out_features = args.width
    if args.model == "toy":
        in_features, out_features = 10, 5
        layers = [torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5)]
    else:
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers).to(device)
    params = sum(p.numel() for p in net.parameters())
    model = DistributedDataParallel(net, device_ids=[device_index])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(args.batch, in_features, device=device)
    y = torch.randn(args.batch, out_features, device=device)

    times_ms = []
    for i in range(args.warmup + args.iters):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        torch.cuda.synchronize(device)
        if i >= args.warmup:
            times_ms.append((time.perf_counter() - start) * 1000.0)
    if dist.get_rank() == 0:
        print("ddp_step_bench impl=torch model=%s backend=%s world=%d params=%d batch=%d warmup=%d iters=%d "
              "median_ms=%.3f p10_ms=%.3f p90_ms=%.3f"
              % (args.model, args.backend, dist.get_world_size(), params, args.batch, args.warmup, args.iters,
                 percentile(times_ms, 0.5), percentile(times_ms, 0.1), percentile(times_ms, 0.9)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
