"""Allreduce latency and bus bandwidth of torch.distributed's Gloo backend.

The PyTorch half of a side-by-side benchmark: bench/allreduce_bench.cpp is
the ddp half, and this script follows its methodology step for step (see the
comment at the top of that file); bench/run_allreduce_bench.py runs both.

Usage (an interpreter with torch: current PyTorch, e.g. the 2.11 venv of
scripts/compat.sh, or Debian's /usr/bin/python3 for 1.13; launched by our own
ddprun so that both halves start the same way, though torchrun works as well):
  build/ddprun --nproc-per-node 2 --no-prefix ~/.cache/ddp/torch-2.11.0/bin/python \\
      bench/allreduce_bench.py [--sizes 4096,1M,64M] [--iters N] [--warmup N]
prints on rank 0, for each size, one line
  allreduce_bench impl=torch backend=gloo world=2 dtype=float32 bytes=4096 warmup=100 iters=1000 median_us=61.20 p10_us=55.31 p90_us=70.02 busbw_gbps=0.0669
and exits 0. It exits 1 if a collective gives a wrong sum, and 2 on a bad
command line.
"""

import sys
import time

import torch
import torch.distributed as dist

KIB = 1024
MIB = 1024 * KIB

# The same constants as allreduce_bench.cpp.
DEFAULT_SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
TIMED_BYTES_PER_SIZE = 256 * MIB
MIN_ITERS = 20
MAX_ITERS = 1000
MIN_WARMUP = 5


def iters_for(nbytes):
    return min(max(TIMED_BYTES_PER_SIZE // nbytes, MIN_ITERS), MAX_ITERS)


def warmup_for(iters):
    return max(MIN_WARMUP, iters // 10)


def usage_error(message):
    sys.stderr.write(
        "allreduce_bench.py: %s\n"
        "usage: allreduce_bench.py [--sizes BYTES[,BYTES...]] [--iters N] [--warmup N]\n"
        "BYTES may end in K (KiB) or M (MiB) and must be a positive multiple of 4.\n" % message)
    sys.exit(2)


def parse_count(text, allow_suffix):
    """A non-negative integer with an optional K or M suffix; -1 if malformed."""
    scale = 1
    digits = text
    if allow_suffix and digits[-1:] in ("K", "M"):
        scale = KIB if digits[-1] == "K" else MIB
        digits = digits[:-1]
    if not digits or len(digits) > 12 or not all("0" <= c <= "9" for c in digits):
        return -1
    return int(digits) * scale


def parse_args(argv):
    sizes, iters, warmup = list(DEFAULT_SIZES), 0, -1
    i = 1
    while i < len(argv):
        flag = argv[i]
        if i + 1 >= len(argv):
            usage_error("missing value after '%s'" % flag)
        value = argv[i + 1]
        i += 2
        if flag == "--sizes":
            sizes = []
            for item in value.split(","):
                nbytes = parse_count(item, allow_suffix=True)
                if nbytes <= 0 or nbytes % 4 != 0:
                    usage_error("--sizes: each size must be a positive multiple of 4 bytes "
                                "(got '%s')" % item)
                sizes.append(nbytes)
        elif flag == "--iters":
            iters = parse_count(value, allow_suffix=False)
            if iters <= 0:
                usage_error("--iters must be an integer >= 1 (got '%s')" % value)
        elif flag == "--warmup":
            warmup = parse_count(value, allow_suffix=False)
            if warmup < 0:
                usage_error("--warmup must be an integer >= 0 (got '%s')" % value)
        else:
            usage_error("unknown flag '%s'" % flag)
    return sizes, iters, warmup


def quantile(ordered, q):
    """The value at quantile q of `ordered`: nearest rank, halves rounded up (as in C++)."""
    index = int(q * (len(ordered) - 1) + 0.5)
    return ordered[min(index, len(ordered) - 1)]


def run_size(rank, world, nbytes, iters, warmup):
    """Runs one size; returns False if the check sum is wrong."""
    tensor = torch.empty(nbytes // 4, dtype=torch.float32)

    tensor.fill_(rank + 1.0)
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2.0
    if not bool((tensor == expected).all()):
        sys.stderr.write(
            "allreduce_bench.py: [rank %d/%d] allreduce of %d bytes gave a wrong sum "
            "(expected %g everywhere, got min %g max %g)\n"
            % (rank, world, nbytes, expected, tensor.min().item(), tensor.max().item()))
        return False
    tensor.zero_()

    for _ in range(warmup):
        dist.all_reduce(tensor)

    seconds = torch.empty(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds[i] = time.perf_counter() - start
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)

    if rank == 0:
        ordered = sorted(seconds.tolist())
        median = quantile(ordered, 0.5)
        busbw = 2.0 * (world - 1) / world * nbytes / median
        print("allreduce_bench impl=torch backend=gloo world=%d dtype=float32 bytes=%d warmup=%d "
              "iters=%d median_us=%.2f p10_us=%.2f p90_us=%.2f busbw_gbps=%.4f"
              % (world, nbytes, warmup, iters, median * 1e6, quantile(ordered, 0.1) * 1e6,
                 quantile(ordered, 0.9) * 1e6, busbw / 1e9), flush=True)
    return True


def main():
    sizes, iters_flag, warmup_flag = parse_args(sys.argv)
    # One intra-op thread, as the C++ half: two ranks share two cores.
    torch.set_num_threads(1)
    # env://: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the launcher.
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = True
    for nbytes in sizes:
        iters = iters_flag if iters_flag > 0 else iters_for(nbytes)
        warmup = warmup_flag if warmup_flag >= 0 else warmup_for(iters)
        if not run_size(rank, world, nbytes, iters, warmup):
            ok = False
            break
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
