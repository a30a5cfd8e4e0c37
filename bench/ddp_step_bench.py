"""Time of one DistributedDataParallel training step on the CPU, PyTorch's half.

The same models, batches and methodology as bench/ddp_step_bench.cpp (the
comment at its top is the reference), with torch.nn.parallel's
DistributedDataParallel over torch.distributed's Gloo backend.

Usage (an interpreter with torch: current PyTorch, e.g. the 2.11 venv of
scripts/compat.sh, or Debian's /usr/bin/python3 for 1.13; launched by our own
ddprun so that both halves start the same way, though torchrun works as well):
  build/ddprun --nproc-per-node 2 --no-prefix ~/.cache/ddp/torch-2.11.0/bin/python \\
      bench/ddp_step_bench.py [--model toy|mlp] [--mode ddp|local] [--batch N]
      [--iters N] [--warmup N]
prints on rank 0 one line
  ddp_step_bench impl=torch torch=2.11.0 blas=MKL backend=gloo model=toy mode=ddp world=2 params=165 batch=20 warmup=50 iters=500 median_ms=0.512 p10_ms=0.401 p90_ms=0.733
and exits 0. It exits 2 on a bad command line.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

# The same constants as ddp_step_bench.cpp.
TOY_IN, TOY_HIDDEN, TOY_OUT, TOY_BATCH = 10, 10, 5, 20
MLP_WIDTH, MLP_LAYERS, MLP_BATCH = 2500, 4, 8
LEARNING_RATE = 0.001


def usage_error(message):
    sys.stderr.write(
        "ddp_step_bench.py: %s\n"
        "usage: ddp_step_bench.py [--model toy|mlp] [--mode ddp|local] [--batch N] "
        "[--iters N] [--warmup N]\n" % message)
    sys.exit(2)


def parse_count(text):
    """A non-negative integer; -1 if malformed."""
    if not text or len(text) > 12 or not all("0" <= c <= "9" for c in text):
        return -1
    return int(text)


def parse_args(argv):
    config = {"model": "toy", "mode": "ddp", "batch": 0, "iters": 0, "warmup": -1}
    i = 1
    while i < len(argv):
        flag = argv[i]
        if i + 1 >= len(argv):
            usage_error("missing value after '%s'" % flag)
        value = argv[i + 1]
        i += 2
        if flag == "--model":
            if value not in ("toy", "mlp"):
                usage_error("--model must be toy or mlp (got '%s')" % value)
            config["model"] = value
        elif flag == "--mode":
            if value not in ("ddp", "local"):
                usage_error("--mode must be ddp or local (got '%s')" % value)
            config["mode"] = value
        elif flag in ("--batch", "--iters"):
            count = parse_count(value)
            if count <= 0:
                usage_error("%s must be an integer >= 1 (got '%s')" % (flag, value))
            config[flag[2:]] = count
        elif flag == "--warmup":
            config["warmup"] = parse_count(value)
            if config["warmup"] < 0:
                usage_error("--warmup must be an integer >= 0 (got '%s')" % value)
        else:
            usage_error("unknown flag '%s'" % flag)
    toy = config["model"] == "toy"
    if config["batch"] == 0:
        config["batch"] = TOY_BATCH if toy else MLP_BATCH
    if config["iters"] == 0:
        config["iters"] = 500 if toy else 20
    if config["warmup"] < 0:
        config["warmup"] = 50 if toy else 3
    return config


def make_model(name):
    if name == "toy":
        return nn.Sequential(nn.Linear(TOY_IN, TOY_HIDDEN), nn.ReLU(),
                             nn.Linear(TOY_HIDDEN, TOY_OUT))
    layers = []
    for index in range(MLP_LAYERS):
        if index > 0:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(MLP_WIDTH, MLP_WIDTH))
    return nn.Sequential(*layers)


def blas_in_use():
    """The BLAS this process's torch computes with, as one word (the C++
    half's ddp::BlasInfo::token()): a BLAS library mapped into the process,
    else MKL when torch links it in (PyPI's wheels)."""
    mapped = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.startswith("/"):
                    mapped.add(os.path.realpath(path))
    except OSError:
        pass
    names = [os.path.basename(path) for path in mapped]
    if any(name.startswith("libopenblas") for name in names):
        return "OpenBLAS"
    if any(name.startswith("libmkl") for name in names) or torch.backends.mkl.is_available():
        return "MKL"
    if any(name.startswith("libblis") for name in names):
        return "BLIS"
    if any(name.startswith("libblas.so") for name in names):
        return "reference-BLAS"
    return "unknown"


def quantile(ordered, q):
    """The value at quantile q of `ordered`: nearest rank, halves rounded up (as in C++)."""
    index = int(q * (len(ordered) - 1) + 0.5)
    return ordered[min(index, len(ordered) - 1)]


def main():
    config = parse_args(sys.argv)
    # One intra-op thread, as the C++ half: two ranks share the cores.
    torch.set_num_threads(1)
    # env://: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the launcher.
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    toy = config["model"] == "toy"

    torch.manual_seed(0)
    net = make_model(config["model"])
    params = sum(p.numel() for p in net.parameters())
    model = nn.parallel.DistributedDataParallel(net) if config["mode"] == "ddp" else net
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.MSELoss()
    torch.manual_seed(rank + 1)
    x = torch.randn(config["batch"], TOY_IN if toy else MLP_WIDTH)
    y = torch.randn(config["batch"], TOY_OUT if toy else MLP_WIDTH)

    warmup, iters = config["warmup"], config["iters"]
    ms = torch.empty(iters, dtype=torch.float64)
    dist.barrier()
    for i in range(warmup + iters):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        elapsed = (time.perf_counter() - start) * 1e3
        if i >= warmup:
            ms[i - warmup] = elapsed
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)

    if rank == 0:
        ordered = sorted(ms.tolist())
        print("ddp_step_bench impl=torch torch=%s blas=%s backend=gloo model=%s mode=%s world=%d "
              "params=%d batch=%d warmup=%d iters=%d median_ms=%.3f p10_ms=%.3f p90_ms=%.3f"
              % (torch.__version__.split("+")[0], blas_in_use(), config["model"],
                 config["mode"], world, params, config["batch"], warmup,
                 iters, quantile(ordered, 0.5), quantile(ordered, 0.1),
                 quantile(ordered, 0.9)), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
