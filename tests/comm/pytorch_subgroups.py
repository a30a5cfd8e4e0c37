"""Parity of DDP over subgroups with PyTorch's: two replica groups, {0, 2}
and {1, 3}, in one job of 4 ranks, each training its own data with
DistributedDataParallel over its group (subgroups_main's "independent DDP
replica groups" case, repeated with torch.distributed.new_group and
torch.nn.parallel.DistributedDataParallel).

As the driver (what CTest runs), it runs subgroups_main and this file's
reference role, each under ddprun with 4 ranks, and compares the final
parameters that each group's rank 0 wrote: they must agree to 1e-5, and
training must have moved them well beyond that. Fails (does not skip)
without torch.

Usage (registered with CTest as subgroups_pytorch_parity):
  /usr/bin/python3 tests/comm/pytorch_subgroups.py --ddprun build/ddprun \
      --ours build/tests/subgroups_main --python /usr/bin/python3 --workdir build/tests
prints one line per group and exits 1 on any difference. The reference
role (run by the driver):
  build/ddprun --nproc-per-node 4 /usr/bin/python3 tests/comm/pytorch_subgroups.py \
      --reference OUT_PREFIX
writes OUT_PREFIX.group<g>.txt (and .initial.txt) on each group's rank 0,
and, where PyTorch's new_group takes use_local_synchronization (2.0 on),
each rank's sums of subgroups_main's local-synchronization case.
"""

import argparse
import os
import subprocess
import sys

TOLERANCE = 1e-5
WORLD = 4
STEPS = 5
LEARNING_RATE = 0.2
RUN_TIMEOUT_S = 100


def reference(prefix):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    # The closed-form model and data of tests/nn/closed_form.h, as the DDP
    # parity reference spells them in Python.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nn"))
    import pytorch_ddp_reference as closed_form

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = [[r for r in range(WORLD) if r % 2 == g] for g in range(2)]
    handles = [dist.new_group(ranks) for ranks in groups]
    g = rank % 2
    mine = handles[g]

    def perturbed(source_rank):
        net = closed_form.make_mlp()
        closed_form.init_closed_form(net)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.01 * (source_rank + 1))
        return net

    net = perturbed(rank)  # DDP's construction must copy the group's rank 0
    model = DistributedDataParallel(net, process_group=mine)
    sampler = DistributedSampler(range(closed_form.K_GLOBAL_BATCH),
                                 num_replicas=dist.get_world_size(mine),
                                 rank=dist.get_rank(mine), shuffle=False)
    index = torch.tensor(list(sampler), dtype=torch.long)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    offset = 1000 * g  # each group its own data
    for step in range(STEPS):
        x, y = closed_form.samples(offset + step * closed_form.K_GLOBAL_BATCH,
                                   closed_form.K_GLOBAL_BATCH)
        optimizer.zero_grad()
        F.mse_loss(model(x.index_select(0, index)), y.index_select(0, index)).backward()
        optimizer.step()
    if dist.get_rank(mine) == 0:
        closed_form.write_state_text(net, "%s.group%d.txt" % (prefix, g))
        closed_form.write_state_text(perturbed(groups[g][0]),
                                     "%s.group%d.initial.txt" % (prefix, g))
    dist.barrier()
    local_synchronization(dist, rank, prefix)
    dist.destroy_process_group()
    return 0


def local_synchronization(dist, rank, prefix):
    """subgroups_main's use_local_synchronization case: only the members
    call new_group; each rank writes the sums of its groups' allreduces to
    OUT_PREFIX.local_sync.rank<r>.txt. PyTorch 1.13 has no such option:
    nothing is written, and the driver says so."""
    import inspect
    import torch
    if "use_local_synchronization" not in inspect.signature(dist.new_group).parameters:
        return

    def sum_over(group):
        t = torch.full((1,), float(rank))
        dist.all_reduce(t, group=group)
        return t.item()

    sums = [sum_over(dist.new_group([0, 1] if rank < 2 else [3, 2], use_local_synchronization=True))]
    if rank in (1, 2):
        first = dist.new_group([1, 2], use_local_synchronization=True)
        second = dist.new_group([2, 1], use_local_synchronization=True)
        sums += [sum_over(second), sum_over(first)]
    with open("%s.local_sync.rank%d.txt" % (prefix, rank), "w") as out:
        out.write("".join("%g\n" % v for v in sums))
    dist.barrier()


def read_state(path):
    values = {}
    with open(path) as text:
        for line in text:
            fields = line.split()
            if not fields[0].endswith(".grad_defined"):
                values[fields[0]] = [float(v) for v in fields[1:]]
    return values


def max_difference(a, b):
    if list(a) != list(b):
        raise ValueError("different parameters: %s vs %s" % (list(a), list(b)))
    worst = (0.0, "")
    for name in a:
        d = max((abs(x - y) for x, y in zip(a[name], b[name])), default=0.0)
        if d >= worst[0]:
            worst = (d, name)
    return worst


def run(command, what):
    print("running %s: %s" % (what, " ".join(command)), flush=True)
    try:
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        output = e.stdout or b""
        sys.stdout.write(output.decode(errors="replace") if isinstance(output, bytes) else output)
        print("FAILED: %s did not finish in %d s" % (what, RUN_TIMEOUT_S))
        return False
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        print("FAILED: %s exited with %d" % (what, result.returncode))
        return False
    return True


def compare_local_synchronization(ours, theirs):
    """1 if the two sides' use_local_synchronization sums differ."""
    def sums(prefix, r):
        with open("%s.local_sync.rank%d.txt" % (prefix, r)) as text:
            return [float(v) for v in text.read().split()]
    if not os.path.exists("%s.local_sync.rank0.txt" % theirs):
        print("[ok] use_local_synchronization: this PyTorch's new_group has no such option "
              "(1.13); compared with PyTorch >= 2.0 only")
        return 0
    try:
        pairs = [(sums(ours, r), sums(theirs, r)) for r in range(WORLD)]
    except OSError as e:
        print("[FAILED] use_local_synchronization: %s" % e)
        return 1
    if any(a != b for a, b in pairs):
        print("[FAILED] use_local_synchronization: sums per rank, ours %s, PyTorch %s"
              % ([a for a, _ in pairs], [b for _, b in pairs]))
        return 1
    print("[ok] use_local_synchronization: the groups' allreduces agree on every rank %s"
          % [a for a, _ in pairs])
    return 0


def driver(args):
    probe = subprocess.run(
        [args.python, "-c", "import torch, torch.distributed as d; assert d.is_gloo_available()"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        print("FAILED: %s cannot import torch with gloo (install Debian's python3-torch):\n%s"
              % (args.python, probe.stdout))
        return 1
    tag = str(os.getpid())
    ours = os.path.join(args.workdir, "subgroups_parity_%s_ours" % tag)
    theirs = os.path.join(args.workdir, "subgroups_parity_%s_torch" % tag)
    ok = run([args.ddprun, "--nproc-per-node", str(WORLD), args.ours, ours], "ours")
    ok = run([args.ddprun, "--nproc-per-node", str(WORLD), args.python,
              os.path.abspath(__file__), "--reference", theirs], "PyTorch") and ok
    if not ok:
        return 1
    status = 0
    for g in range(2):
        try:
            mine = read_state("%s.group%d.txt" % (ours, g))
            torch_state = read_state("%s.group%d.txt" % (theirs, g))
            initial = read_state("%s.group%d.initial.txt" % (theirs, g))
            difference, where = max_difference(mine, torch_state)
            moved, _ = max_difference(torch_state, initial)
        except (OSError, ValueError) as e:
            print("[FAILED] group %d: %s" % (g, e))
            status = 1
            continue
        problems = []
        if difference > TOLERANCE:
            problems.append("max |ours - PyTorch| %.3g at %s (tolerance %g)"
                            % (difference, where, TOLERANCE))
        if moved <= 100 * TOLERANCE:
            problems.append("training moved the weights by only %.3g" % moved)
        for problem in problems:
            print("[FAILED] group %d: %s" % (g, problem))
        if problems:
            status = 1
        else:
            print("[ok] group %d (ranks %s): max |ours - PyTorch| %.3g at %s (tolerance %g); "
                  "training moved the weights by up to %.3g"
                  % (g, ", ".join(str(r) for r in range(g, WORLD, 2)), difference, where,
                     TOLERANCE, moved))
    status = compare_local_synchronization(ours, theirs) or status
    print("subgroups parity with PyTorch: %s" % ("passed" if status == 0 else "FAILED"))
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", metavar="OUT_PREFIX")
    parser.add_argument("--ddprun")
    parser.add_argument("--ours")
    parser.add_argument("--python")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.reference:
        return reference(args.reference)
    for name in ("ddprun", "ours", "python", "workdir"):
        if getattr(args, name) is None:
            parser.error("--%s is needed (or --reference OUT_PREFIX)" % name)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
