"""PyTorch's own bucket assignment, for bucket_assignment_test's parity case.

Prints one line per generated case: what the case is, then what
torch.distributed._compute_bucket_assignment_by_size (the function PyTorch's
DDP builds its buckets with, at construction and when it rebuilds them after
the first iteration) returns for it:

  DTYPES|NUMELS|SPARSE|LIMITS|ORDER|BUCKETS

DTYPES are ScalarType codes (6 Float, 7 Double, 5 Half), NUMELS element
counts, SPARSE 0/1 per tensor (expect_sparse_gradient), LIMITS the bucket
size limits in bytes, ORDER the tensor_indices (the fill order of a rebuild:
the order gradients became ready), or "-" for none (construction: index
order); BUCKETS the buckets, ';'-separated, each a ','-separated list of
tensor indices. The cases are fixed (seeded): sizes around the limits,
PyTorch's defaults (1 MiB first, then 25 MiB), small limits, mixed dtypes,
sparse tensors.

Usage: python3 bucket_reference.py   (an interpreter with torch)
"""

import random
import sys

import torch
import torch.distributed as dist

DTYPES = {6: torch.float32, 7: torch.float64, 5: torch.float16}
ITEMSIZE = {6: 4, 7: 8, 5: 2}
MIB = 1024 * 1024


def generated_cases():
    rng = random.Random(20261125)
    limit_sets = [
        [MIB, 25 * MIB],           # DDP's defaults
        [25 * MIB],                # bucket_cap_mb set by the user
        [MIB],
        [4096, 65536],
        [100, 1000, 10000],
        [1 << 62],                 # one bucket per dtype (PyTorch 2.x's first iteration)
    ]
    for case in range(400):
        limits = limit_sets[case % len(limit_sets)]
        count = rng.randint(1, 12)
        dtypes, numels, sparse = [], [], []
        for _ in range(count):
            code = rng.choice([6, 6, 6, 7, 5])
            size = ITEMSIZE[code]
            pick = rng.random()
            if pick < 0.3:
                # Exactly at, just under or just over one of the limits.
                limit = rng.choice(limits[:2]) if limits[0] < (1 << 40) else MIB
                numel = max(1, limit // size + rng.choice([-1, 0, 1]))
            elif pick < 0.6:
                numel = rng.randint(1, 2000)
            else:
                numel = rng.randint(1, 700000)
            dtypes.append(code)
            numels.append(numel)
            sparse.append(1 if rng.random() < 0.1 else 0)
        order = None
        if case % 3 == 1:
            order = list(range(count))
            rng.shuffle(order)
        yield dtypes, numels, sparse, limits, order


def main():
    for dtypes, numels, sparse, limits, order in generated_cases():
        tensors = [torch.empty(n, dtype=DTYPES[d]) for d, n in zip(dtypes, numels)]
        if order is not None:
            # As the Reducer's rebuild calls it: the tensors in the order they
            # became ready, and each one's index among the parameters.
            result = dist._compute_bucket_assignment_by_size(
                [tensors[i] for i in order], limits, [bool(s) for s in sparse], order)
        else:
            result = dist._compute_bucket_assignment_by_size(
                tensors, limits, [bool(s) for s in sparse])
        # 2.x returns (buckets, per-bucket limits); 1.13 too; older ones only buckets.
        buckets = result[0] if isinstance(result, tuple) else result
        print("|".join([
            ",".join(map(str, dtypes)),
            ",".join(map(str, numels)),
            ",".join(map(str, sparse)),
            ",".join(map(str, limits)),
            ",".join(map(str, order)) if order is not None else "-",
            ";".join(",".join(map(str, bucket)) for bucket in buckets),
        ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
