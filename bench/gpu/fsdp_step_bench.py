"""PyTorch's FullyShardedDataParallel on CUDA: the reference half of
bench/fsdp_bench.cpp with --device cuda, the same model (4 x
Linear(2500, 2500), ReLU between, each Linear a unit), batch, optimizer
(SGD, lr 1e-3) and methodology (see that file).

Usage:
  build/ddprun --nproc-per-node 2 --no-prefix python3 bench/gpu/fsdp_step_bench.py \
      [--mode speed] --backend gloo|nccl [--batch N] [--iters N] [--warmup N] [--rounds R]
(torchrun works too). Rank 0 prints one line per variant,
  fsdp_bench impl=torch mode=speed backend=gloo world=2 device=cuda batch=512 variant=fsdp-full params=... median_ms=... ratio=...
for ddp (DistributedDataParallel, the anchor), fsdp-full (FULL_SHARD),
fsdp-full-prefetch (forward_prefetch=True), fsdp-grad-op (SHARD_GRAD_OP)
and fsdp-grad-op-prefetch. Backward prefetch is PyTorch's default
(BACKWARD_PRE), as ddp's backward_prefetch. Exits 0; 77 without a GPU.
"""

import argparse
import sys

from sharding_bench import alternate_rounds, make_mlp, print_speed, start

WIDTH = 2500
LAYERS = 4
LEARNING_RATE = 1e-3
NAMES = ("ddp", "fsdp-full", "fsdp-full-prefetch", "fsdp-grad-op", "fsdp-grad-op-prefetch")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("speed",), default="speed",
                        help="speed only (as zero_step_bench.py's --mode)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def make_variant(torch, name, device):
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    net = make_mlp(torch, WIDTH, LAYERS)
    params = sum(p.numel() for p in net.parameters())
    net = net.to(device)
    if name == "ddp":
        model = DistributedDataParallel(net, device_ids=[device.index])
    else:
        strategy = ShardingStrategy.FULL_SHARD if name.startswith("fsdp-full") else ShardingStrategy.SHARD_GRAD_OP
        model = FullyShardedDataParallel(
            net, sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
            forward_prefetch=name.endswith("prefetch"),
            device_id=device, use_orig_params=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    return {"name": name, "params": params, "model": model, "optimizer": optimizer, "medians": []}


def step(torch, v, x, y):
    v["optimizer"].zero_grad()
    torch.nn.functional.mse_loss(v["model"](x), y).backward()
    v["optimizer"].step()


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    # PyTorch's FSDP refuses the CPU ("FSDP needs a non-CPU accelerator device").
    started = start(torch, dist, "cuda", args.backend)
    if started is None:
        return 77
    device, rank, world = started
    variants = [make_variant(torch, name, device) for name in NAMES]
    torch.manual_seed(1 + rank)
    x = torch.randn(args.batch, WIDTH).to(device)
    y = torch.randn(args.batch, WIDTH).to(device)
    alternate_rounds(torch, dist, variants, lambda v: step(torch, v, x, y), device, args)
    if rank == 0:
        print_speed("fsdp_bench impl=torch mode=speed backend=%s world=%d device=%s batch=%d"
                    % (args.backend, world, device.type, args.batch), variants)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
