"""Parity of the object collectives (send_object_list/recv_object_list too),
uneven all-to-all and batch_isend_irecv
with PyTorch's own (Gloo, on the CPU): the same calls with the same objects
and tensors on 2 and 3 ranks, in objects_main --dump (ddp) and in this
file's reference role (PyTorch), each rank pickling what it received; the
two must be equal on every rank. Python's torch.load reads ddp's pickles
(torch::pickle_save), which this checks too. Fails (does not skip) without
torch.

Usage (registered with CTest as objects_pytorch_parity):
  /usr/bin/python3 tests/comm/pytorch_objects_parity.py --ddprun build/ddprun \\
      --ours build/tests/objects_main --python /usr/bin/python3
prints one line per world size and rank, then
"objects_pytorch_parity: N of N checks passed". The reference role:
  build/ddprun --nproc-per-node 2 /usr/bin/python3 tests/comm/pytorch_objects_parity.py --reference PREFIX
"""

import argparse
import os
import subprocess
import sys
import tempfile

RUN_TIMEOUT_S = 100


def object_of(rank):
    import torch
    # objects_main.cpp's object_of, spelled in Python.
    return {
        "rank": rank,
        "name": "rank %d" % rank,
        "weights": torch.arange(5, dtype=torch.float) * rank,
        "scale": 0.5 + rank,
        "nested": [[rank, rank + 1], "x" * rank, None],
    }


def reference(prefix):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    gathered = [None] * world
    dist.all_gather_object(gathered, object_of(rank))
    out["all_gather_object"] = gathered
    objects = [object_of(rank), "from the last rank"] if rank == world - 1 else [None, None]
    dist.broadcast_object_list(objects, src=world - 1)
    out["broadcast_object_list"] = objects
    at_root = [None] * world if rank == 0 else None
    dist.gather_object(object_of(rank), at_root, dst=0)
    out["gather_object"] = at_root if rank == 0 else []
    scattered = [None]
    dist.scatter_object_list(scattered, [object_of(r) for r in range(world)] if rank == 0 else None, src=0)
    out["scatter_object_list"] = scattered[0]
    p2p = []
    if not hasattr(dist, "send_object_list"):  # PyTorch 1.13
        p2p = None
    elif rank == 0:
        dist.send_object_list([object_of(0), "to the last rank", None], dst=world - 1)
    elif rank == world - 1:
        p2p = [None] * 3
        p2p.append(dist.recv_object_list(p2p, src=0))
    out["send_object_list"] = p2p
    in_splits = [(rank + 2 * r) % 3 + 3 for r in range(world)]
    out_splits = [(r + 2 * rank) % 3 + 3 for r in range(world)]
    blocks = [(torch.arange(rows * 2, dtype=torch.double) + (rank * 1e9 + r * 1e7)).view(rows, 2)
              for r, rows in enumerate(in_splits)]
    output = torch.empty(sum(out_splits), 2, dtype=torch.double)
    dist.all_to_all_single(output, torch.cat(blocks), out_splits, in_splits)
    out["all_to_all_single"] = output
    right, left = (rank + 1) % world, (rank + world - 1) % world
    from_left, from_right = torch.zeros(4), torch.zeros(4)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.irecv, from_left, left),
        dist.P2POp(dist.irecv, from_right, right, tag=1),
        dist.P2POp(dist.isend, torch.full((4,), 1.0 * rank), right),
        dist.P2POp(dist.isend, torch.full((4,), 100.0 + rank), left, tag=1),
    ])
    for work in works:
        work.wait()
    out["ring"] = [from_left, from_right]
    torch.save(out, "%s.rank%d.pt" % (prefix, rank))
    dist.barrier()
    dist.destroy_process_group()


def same(a, b, path="."):
    """None when a equals b (tensors exactly), else where they differ."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(a, b)
        return None if ok else "%s: %r vs %r" % (path, a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a) != sorted(b):
            return "%s: keys %s vs %s" % (path, sorted(a), sorted(b))
        for key in a:
            where = same(a[key], b[key], "%s[%r]" % (path, key))
            if where:
                return where
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return "%s: %d vs %d items" % (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            where = same(x, y, "%s[%d]" % (path, i))
            if where:
                return where
        return None
    return None if (type(a) == type(b) and a == b) else "%s: %r vs %r" % (path, a, b)


def load(path):
    import torch
    try:
        return torch.load(path, weights_only=False)
    except TypeError:  # PyTorch 1.13: no weights_only
        return torch.load(path)


def driver(args, script=None, name="objects_pytorch_parity", worlds=(2, 3),
           what="all_gather_object, broadcast_object_list, gather_object, scatter_object_list, "
                "send_object_list/recv_object_list, all_to_all_single (uneven), batch_isend_irecv",
           prepare=None):
    """Runs `args.ours --dump` and `script --reference` under ddprun for each
    world size and compares every rank's pickles (after `prepare(ours,
    theirs)`, when given); shared with
    tests/model_averaging/pytorch_averaging_parity.py."""
    script = script or os.path.abspath(__file__)
    passed = total = 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="ddp-%s." % name) as work:
        for world in worlds:
            ours = os.path.join(work, "ours%d" % world)
            theirs = os.path.join(work, "theirs%d" % world)
            runs = [
                [args.ddprun, "--nproc-per-node", str(world), args.ours, "--dump", ours],
                [args.ddprun, "--nproc-per-node", str(world), args.python, script, "--reference", theirs],
            ]
            for command in runs:
                result = subprocess.run(command, env=env, timeout=RUN_TIMEOUT_S, capture_output=True, text=True)
                if result.returncode != 0:
                    print("FAILED: %s exited %d:\n%s%s" % (" ".join(command), result.returncode, result.stdout,
                                                          result.stderr))
            for rank in range(world):
                total += 1
                try:
                    mine, reference_result = load("%s.rank%d.pt" % (ours, rank)), load("%s.rank%d.pt" % (theirs, rank))
                    if prepare:  # drops what this PyTorch cannot run, saying so
                        prepare(mine, reference_result)
                    where = same(mine, reference_result)
                except Exception as e:  # a missing or unreadable file
                    where = "cannot compare: %s" % e
                if where:
                    print("[FAILED] %d ranks, rank %d: ddp and PyTorch differ at %s" % (world, rank, where))
                else:
                    passed += 1
                    print("[ok] %d ranks, rank %d: %s equal" % (world, rank, what))
    print("%s: %d of %d checks passed" % (name, passed, total))
    return 0 if passed == total and total > 0 else 1


def parse_args(doc):
    """The flags of both roles (shared with pytorch_averaging_parity.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--reference")
    parser.add_argument("--ddprun")
    parser.add_argument("--ours")
    parser.add_argument("--python", default=sys.executable)
    return parser.parse_args()


def main():
    args = parse_args(__doc__)
    if args.reference:
        reference(args.reference)
        return 0

    def prepare(ours, theirs):
        if theirs.get("send_object_list", 0) is None:
            del ours["send_object_list"], theirs["send_object_list"]
            print("This PyTorch (1.13) has no send_object_list/recv_object_list: compared with PyTorch 2.x only")

    return driver(args, prepare=prepare)


if __name__ == "__main__":
    sys.exit(main())
