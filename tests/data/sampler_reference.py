"""Reference indices from PyTorch's torch.utils.data.DistributedSampler.

Run with /usr/bin/python3 (Debian's python3-torch). Prints one line per case:

    <length> <num_replicas> <rank> <shuffle> <seed> <epoch> <drop_last> <len>: <i0> <i1> ...

where shuffle and drop_last are 0 or 1 and <len> is len(sampler). The C++
parity test (tests/data/distributed_sampler_test.cpp) builds
ddp::DistributedSampler for every case and compares the indices exactly.
"""

import itertools
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

LENGTHS = [0, 1, 2, 3, 5, 7, 10, 17, 100, 1001]
REPLICAS = [1, 2, 3, 4, 7]
SEEDS = [0, 42]
EPOCHS = [0, 1, 5]

# Seeds whose sum with the epoch exercises the 64-bit seed conversion
# (negative, and past 2**32), on a smaller grid.
EXTRA_LENGTHS = [17, 100]
EXTRA_SEEDS = [-7, 2**40 + 3]
EXTRA_EPOCHS = [0, 3]


def cases():
    grid = itertools.product(
        LENGTHS, REPLICAS, [False, True], SEEDS, EPOCHS, [False, True])
    extra = itertools.product(
        EXTRA_LENGTHS, REPLICAS, [True], EXTRA_SEEDS, EXTRA_EPOCHS,
        [False, True])
    for length, replicas, shuffle, seed, epoch, drop_last in itertools.chain(
            grid, extra):
        for rank in range(replicas):
            yield length, replicas, rank, shuffle, seed, epoch, drop_last


def main():
    out = []
    for length, replicas, rank, shuffle, seed, epoch, drop_last in cases():
        # The sampler only needs len(dataset).
        sampler = DistributedSampler(
            range(length), num_replicas=replicas, rank=rank, shuffle=shuffle,
            seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        out.append("%d %d %d %d %d %d %d %d: %s" % (
            length, replicas, rank, int(shuffle), seed, epoch, int(drop_last),
            len(sampler), " ".join(str(i) for i in indices)))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
