"""PyTorch's ZeroRedundancyOptimizer on CUDA: the reference half of
bench/zero_bench.cpp with --device cuda, the same model, batch, optimizer
and methodology (see that file).

Usage:
  build/ddprun --nproc-per-node 2 --no-prefix python3 bench/gpu/zero_step_bench.py \
      --mode speed --backend gloo|nccl [--batch N] [--iters N] [--warmup N] [--rounds R]
  build/ddprun --nproc-per-node 2 --no-prefix python3 bench/gpu/zero_step_bench.py \
      --mode memory --variant ddp-adam|zero1 --backend gloo|nccl [--width N] [--layers L] [--batch N]
(torchrun works too). speed: rank 0 prints one line per variant,
  zero_bench impl=torch mode=speed backend=gloo world=2 device=cuda batch=8 variant=zero1 params=... median_ms=... ratio=...
for ddp-adam (DDP and torch.optim.Adam, the anchor), zero1
(ZeroRedundancyOptimizer) and zero1-overlap (overlap_with_ddp=True with
hook_with_zero_step; NCCL only: PyTorch refuses it on Gloo); PyTorch has
no stage 2. memory: one line per rank with
the optimizer state's bytes and gpu_peak_mb (torch.cuda.max_memory_allocated).
Exits 0; 77 without a GPU.
"""

import argparse
import os
import sys
import time

SPEED_WIDTH = 2500
LAYERS = 4
LEARNING_RATE = 1e-4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("speed", "memory"), required=True)
    parser.add_argument("--variant", choices=("ddp-adam", "zero1"), default="zero1")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: only to try this script on a machine without a GPU")
    parser.add_argument("--width", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def make_mlp(torch, width, layers):
    modules = []
    for i in range(layers):
        modules.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def make_variant(torch, name, width, layers, device):
    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    net = make_mlp(torch, width, layers).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    if name == "ddp-adam":
        optimizer = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE)
    else:
        overlap = name == "zero1-overlap"
        optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam,
                                            lr=LEARNING_RATE, overlap_with_ddp=overlap)
        if overlap:
            model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, optimizer))
    return {"name": name, "net": net, "model": model, "optimizer": optimizer, "medians": []}


def step(torch, v, x, y):
    v["optimizer"].zero_grad()
    torch.nn.functional.mse_loss(v["model"](x), y).backward()
    v["optimizer"].step()


def synchronize(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(torch, dist, v, x, y, warmup, iters):
    for _ in range(warmup):
        step(torch, v, x, y)
    times = []
    for _ in range(iters):
        synchronize(torch, x.device)
        start = time.perf_counter()
        step(torch, v, x, y)
        synchronize(torch, x.device)
        times.append((time.perf_counter() - start) * 1000.0)
    slowest = torch.tensor(times, dtype=torch.float64, device=x.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return sorted(slowest.cpu().tolist())


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: NCCL tests need a GPU")
        return 77
    torch.set_num_threads(1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    if args.mode == "speed":
        batch = args.batch or 8
        # PyTorch refuses overlap_with_ddp on Gloo ("may meet hangs").
        names = ("ddp-adam", "zero1") + (("zero1-overlap",) if args.backend == "nccl" else ())
        variants = [make_variant(torch, name, SPEED_WIDTH, LAYERS, device) for name in names]
        torch.manual_seed(1 + rank)
        x = torch.randn(batch, SPEED_WIDTH).to(device)
        y = torch.randn(batch, SPEED_WIDTH).to(device)
        for round_index in range(args.rounds):
            for k in range(len(variants)):
                v = variants[(k + round_index) % len(variants)]
                times = time_steps(torch, dist, v, x, y, args.warmup, args.iters)
                v["medians"].append(times[len(times) // 2])
        if rank == 0:
            anchor = min(variants[0]["medians"])
            for v in variants:
                best = min(v["medians"])
                params = sum(p.numel() for p in v["net"].parameters())
                print("zero_bench impl=torch mode=speed backend=%s world=%d device=%s batch=%d variant=%s "
                      "params=%d median_ms=%.3f ratio=%.3f rounds_ms=%s"
                      % (args.backend, world, device.type, batch, v["name"], params, best, best / anchor,
                         ",".join("%.3f" % m for m in v["medians"])), flush=True)
    else:
        batch = args.batch or 4
        v = make_variant(torch, args.variant, args.width, args.layers, device)
        torch.manual_seed(1 + rank)
        x = torch.randn(batch, args.width).to(device)
        y = torch.randn(batch, args.width).to(device)
        for _ in range(3):
            step(torch, v, x, y)
        synchronize(torch, device)
        optimizer = v["optimizer"].optim if args.variant == "zero1" else v["optimizer"]
        state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                    for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        mine = torch.tensor([float(state), (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0) / 2.0 ** 20],
                            dtype=torch.float64, device=device)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        if rank == 0:
            params = sum(p.numel() for p in v["net"].parameters())
            for r, f in enumerate(every):
                f = f.cpu().tolist()
                print("zero_bench impl=torch mode=memory backend=%s world=%d variant=%s params=%d rank=%d "
                      "state_bytes=%.0f gpu_peak_mb=%d" % (args.backend, world, args.variant, params, r, f[0],
                                                           int(f[1])), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
