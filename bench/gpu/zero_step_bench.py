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
import sys

from sharding_bench import alternate_rounds, make_mlp, print_speed, start, synchronize

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
    return {"name": name, "net": net, "params": sum(p.numel() for p in net.parameters()), "model": model,
            "optimizer": optimizer, "medians": []}


def step(torch, v, x, y):
    v["optimizer"].zero_grad()
    torch.nn.functional.mse_loss(v["model"](x), y).backward()
    if v["name"] != "zero1-overlap":
        # With overlap_with_ddp the step runs inside the DDP hook; PyTorch's
        # step() then only logs a warning (which costs ~1.4 ms a step).
        v["optimizer"].step()


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    started = start(torch, dist, args.device, args.backend)
    if started is None:
        return 77
    device, rank, world = started

    if args.mode == "speed":
        batch = args.batch or 8
        # PyTorch refuses overlap_with_ddp on Gloo ("may meet hangs").
        names = ("ddp-adam", "zero1") + (("zero1-overlap",) if args.backend == "nccl" else ())
        variants = [make_variant(torch, name, SPEED_WIDTH, LAYERS, device) for name in names]
        torch.manual_seed(1 + rank)
        x = torch.randn(batch, SPEED_WIDTH).to(device)
        y = torch.randn(batch, SPEED_WIDTH).to(device)
        alternate_rounds(torch, dist, variants, lambda v: step(torch, v, x, y), device, args)
        if rank == 0:
            print_speed("zero_bench impl=torch mode=speed backend=%s world=%d device=%s batch=%d"
                        % (args.backend, world, device.type, batch), variants)
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
            params = v["params"]
            for r, f in enumerate(every):
                f = f.cpu().tolist()
                print("zero_bench impl=torch mode=memory backend=%s world=%d variant=%s params=%d rank=%d "
                      "state_bytes=%.0f gpu_peak_mb=%d" % (args.backend, world, args.variant, params, r, f[0],
                                                           int(f[1])), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
