"""What PyTorch's halves of the sharding benchmarks (zero_step_bench.py,
fsdp_step_bench.py) share: the MLP, this rank's device, and the per-step
times of the slowest rank, measured as bench/bench_util.h does for ddp's
halves."""

import os
import time


def make_mlp(torch, width, layers):
    """`layers` x Linear(width, width), a ReLU between them."""
    modules = []
    for i in range(layers):
        modules.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def rank_device(torch, device_type):
    """cuda:LOCAL_RANK modulo the GPUs (made current), or the CPU; None when
    a GPU is asked for and there is none."""
    if device_type != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def start(torch, dist, device_type, backend):
    """This rank's device, its group of `backend` (one intra-op thread), its
    rank and the world size; None, after saying why, without a GPU (the
    caller exits 77, a skip)."""
    device = rank_device(torch, device_type)
    if device is None:
        print("no CUDA device: NCCL tests need a GPU")
        return None
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    return device, dist.get_rank(), dist.get_world_size()


def synchronize(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(torch, dist, step, device, warmup, iters):
    """`warmup` calls of `step`, then the times of `iters` more, each the
    slowest rank's, sorted; the device synchronised around each."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        synchronize(torch, device)
        start = time.perf_counter()
        step()
        synchronize(torch, device)
        times.append((time.perf_counter() - start) * 1000.0)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return sorted(slowest.cpu().tolist())


def alternate_rounds(torch, dist, variants, step, device, args):
    """`args.rounds` rounds over `variants` (dicts with a "medians" list),
    the order rotating each round; each round appends a variant's median
    step time. `step(v)` runs one step of variant `v`."""
    for round_index in range(args.rounds):
        for k in range(len(variants)):
            v = variants[(k + round_index) % len(variants)]
            times = time_steps(torch, dist, lambda: step(v), device, args.warmup, args.iters)
            v["medians"].append(times[len(times) // 2])


def print_speed(prefix, variants):
    """One line per variant (dicts with "name", "params", "medians"): its
    lowest median and the ratio to the first variant's."""
    anchor = min(variants[0]["medians"])
    for v in variants:
        best = min(v["medians"])
        print("%s variant=%s params=%d median_ms=%.3f ratio=%.3f rounds_ms=%s"
              % (prefix, v["name"], v["params"], best, best / anchor,
                 ",".join("%.3f" % m for m in v["medians"])), flush=True)
