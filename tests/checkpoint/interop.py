"""Python's side of the checkpoint interoperability tests: interop_main.cpp's
twin. Trains interop_model.py's model alone, under DDP or under FSDP2
(fully_shard on every layer with parameters, then the root), loading and
saving checkpoints with PyTorch's own code; the shell tests compare what it
ends with against what C++ ends with.

Usage (under torchrun for more than one rank):
  interop.py run --parallel plain|ddp|fsdp2 --optim NAME
      [--load-torch DIR | --load-dcp DIR[,DIR...]] [--first-step S] [--steps N]
      [--save-torch DIR] [--save-dcp DIR] [--then-steps M --final FILE[,FILE...]]
      [--device cpu|cuda] [--map-location cpu|cuda] [--expect-torch DIR]
  interop.py compare A B TOLERANCE      two torch.save'd state dicts agree
  interop.py compare-many LISTING       each line "ID<TAB>A<TAB>B<TAB>TOLERANCE" compared so
  interop.py safetensors FILE REF       FILE (safetensors) holds REF's tensors
  interop.py dcp-keys DIR               print the keys of a DCP checkpoint
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interop_model import batch, make_model, make_optimizer  # noqa: E402

MAJOR = int(torch.__version__.split(".")[0])


def load_optimizer_file(path, where=None):
    # PyTorch 1.13's weights_only unpickler has no BINFLOAT: it cannot read
    # any optimizer state dict, its own included.
    return torch.load(path, map_location=where, weights_only=MAJOR >= 2)


def full_states(args, model, net, opt):
    """The full model and optimizer state dicts (under FSDP2 gathered, a
    collective; its optimizer state keyed by parameter name)."""
    if args.parallel != "fsdp2":
        return net.state_dict(), opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def same_as_files(model_state, optim_state, directory, names):
    """Exits with 1 unless the states equal DIR/model.pt and DIR/optim.pt bit
    for bit (optimizer states compared by parameter name)."""
    def by_name(osd):
        keys = [p for g in osd["param_groups"] for p in g["params"]]
        out = {}
        for key, tensors in osd["state"].items():
            name = key if isinstance(key, str) else names[keys.index(key)]
            out[name] = {k: (v if torch.is_tensor(v) else torch.tensor(float(v))) for k, v in tensors.items()
                         if v is not None}
        return out

    def same(a, b):
        a, b = a.detach().cpu(), b.detach().cpu()
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)

    ref_model = torch.load(os.path.join(directory, "model.pt"), map_location="cpu", weights_only=True)
    ref_optim = load_optimizer_file(os.path.join(directory, "optim.pt"), "cpu")
    problems = [k for k in ref_model if k not in model_state or not same(model_state[k], ref_model[k])]
    problems += [k for k in model_state if k not in ref_model]
    mine, theirs = by_name(optim_state), by_name(ref_optim)
    if sorted(mine) != sorted(theirs):
        problems.append("optimizer states of %s against %s" % (sorted(mine), sorted(theirs)))
    else:
        for name in mine:
            for k in set(mine[name]) | set(theirs[name]):
                if k not in mine[name] or k not in theirs[name] or not same(mine[name][k].float() if k == "step" else mine[name][k],
                                                                          theirs[name][k].float() if k == "step" else theirs[name][k]):
                    problems.append("optimizer %s %s" % (name, k))
    if problems:
        print("the loaded state is not %s's: %s" % (directory, ", ".join(problems[:10])))
        sys.exit(1)
    print("interop.py: loaded state equals %s bit for bit" % directory)


def run(args):
    """One launch, one or more runs: --load-dcp and --final may each list
    several paths (comma-separated, as many of each), the same run from each
    checkpoint in turn (a launch of PyTorch costs more than the run)."""
    import torch.distributed as dist

    distributed = args.parallel != "plain"
    rank, world = 0, 1
    if distributed:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", "0")) if args.device == "cuda" else None)
    if args.device == "cuda":
        torch.cuda.set_device(device)
    mesh = None
    if args.parallel == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(args.device, (world,))
    loads = args.load_dcp.split(",")
    finals = args.final.split(",")
    if len(loads) > 1 and len(loads) != len(finals):
        sys.exit("interop.py: --load-dcp lists %d checkpoints, --final %d files" % (len(loads), len(finals)))
    for i, load_dcp in enumerate(loads):
        run_one(args, load_dcp, finals[i] if len(loads) > 1 else args.final, rank, world, device, mesh)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    print("interop.py: done")
    # Every result is written. PyTorch 2.11's Gloo group can abort while the
    # interpreter exits (SIGABRT after the work is done): leave without that
    # teardown, so that only a failure of the runs above fails the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_one(args, load_dcp, final, rank, world, device, mesh):
    net = make_model().to(device)
    model = net
    if args.parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(net)
    elif args.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
    opt = make_optimizer(args.optim, model.parameters())

    if args.load_torch:
        where = args.map_location or None
        net.load_state_dict(torch.load(os.path.join(args.load_torch, "model.pt"), map_location=where, weights_only=True))
        opt.load_state_dict(load_optimizer_file(os.path.join(args.load_torch, "optim.pt"), where))
    if load_dcp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=load_dcp)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    if args.expect_torch:
        model_state, optim_state = full_states(args, model, net, opt)
        if rank == 0:
            same_as_files(model_state, optim_state, args.expect_torch, [n for n, _ in net.named_parameters()])
    step = args.first_step

    def train(n):
        nonlocal step
        for _ in range(n):
            x, y = batch(step, rank, world)
            opt.zero_grad()
            F.mse_loss(model(x.to(device)), y.to(device)).backward()
            opt.step()
            step += 1

    train(args.steps)
    if args.save_torch:
        os.makedirs(args.save_torch, exist_ok=True)
        model_state, optim_state = full_states(args, model, net, opt)
        if rank == 0:
            torch.save(model_state, os.path.join(args.save_torch, "model.pt"))
            torch.save(optim_state, os.path.join(args.save_torch, "optim.pt"))
    if args.save_dcp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=args.save_dcp)
    train(args.then_steps)
    if final:
        if args.parallel == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            full = net.state_dict()
        if rank == 0:
            torch.save({k: v.cpu() for k, v in full.items()}, final)


def difference(a, b, tolerance):
    """(whether two torch.save'd state dicts agree within `tolerance`, what was found)."""
    x = torch.load(a, map_location="cpu", weights_only=True)
    y = torch.load(b, map_location="cpu", weights_only=True)
    if sorted(x) != sorted(y):
        return False, "keys differ: %s against %s" % (sorted(x), sorted(y))
    worst = max((x[k].double() - y[k].double()).abs().max().item() for k in x)
    return worst <= tolerance, "largest difference: %.3g (tolerance %g)" % (worst, tolerance)


def compare(a, b, tolerance):
    agreed, found = difference(a, b, tolerance)
    print(found)
    return 0 if agreed else 1


def compare_many(listing):
    """Each line of LISTING, "ID<TAB>A<TAB>B<TAB>TOLERANCE", compared as `compare` does, all in
    this one process (each Python start costs PyTorch's import): prints "ID ok ..." or
    "ID FAILED ..." per line."""
    for line in open(listing):
        ident, a, b, tolerance = line.rstrip("\n").split("\t")
        try:
            agreed, found = difference(a, b, float(tolerance))
            print("%s %s %s against %s: %s" % (ident, "ok" if agreed else "FAILED", a, b, found))
        except Exception as e:  # a file missing or unreadable: that comparison fails, the others go on
            print("%s FAILED %s against %s: %s" % (ident, a, b, e))
    return 0


def safetensors_check(path, ref):
    expected = torch.load(ref, map_location="cpu", weights_only=True)
    try:
        from safetensors.torch import load_file
    except ImportError:
        # Debian's Python has no safetensors package: read the format with
        # the standard library (the compat configuration uses the package).
        import json
        import struct

        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        codes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "BF16": torch.bfloat16}
        got = {}
        for k, v in header.items():
            if k == "__metadata__":
                continue
            lo, hi = v["data_offsets"]
            data = bytearray(raw[8 + n + lo : 8 + n + hi])
            got[k] = torch.frombuffer(data, dtype=codes[v["dtype"]]).reshape(v["shape"]) if data else \
                torch.empty(v["shape"], dtype=codes[v["dtype"]])
        print("read with the standard library (no safetensors package here)")
    else:
        got = load_file(path)
        print("read with safetensors", __import__("safetensors").__version__)
    same = sorted(got) == sorted(expected) and all(
        got[k].dtype == expected[k].dtype and torch.equal(got[k], expected[k]) for k in expected)
    print("safetensors file %s the reference" % ("equals" if same else "differs from"))
    return 0 if same else 1


def main():
    if sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    if sys.argv[1] == "compare-many":
        return compare_many(sys.argv[2])
    if sys.argv[1] == "safetensors":
        return safetensors_check(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "dcp-keys":
        import pickle

        md = pickle.load(open(os.path.join(sys.argv[2], ".metadata"), "rb"))
        for key in md.state_dict_metadata:
            print(key)
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("--parallel", default="plain")
    p.add_argument("--optim", default="adam")
    p.add_argument("--device", default="cpu")
    p.add_argument("--map-location", default="")
    for flag in ["--load-torch", "--load-dcp", "--save-torch", "--save-dcp", "--final", "--expect-torch"]:
        p.add_argument(flag, default="")
    for flag in ["--first-step", "--steps", "--then-steps"]:
        p.add_argument(flag, type=int, default=0)
    run(p.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
