"""Parity of ddp's DistributedDataParallel with PyTorch's own.

Runs ddp_pytorch_parity_main and pytorch_ddp_reference.py, each under
ddprun with 2 ranks, and compares the final parameters that rank 0 of each
wrote: they must agree to 1e-5, and training must have moved them well
beyond that. Fails (does not skip) when the Python interpreter has no
torch with gloo.

Usage (registered with CTest as ddp_pytorch_parity):
  /usr/bin/python3 tests/nn/pytorch_parity_driver.py --ddprun build/ddprun \
      --ours build/tests/ddp_pytorch_parity_main --python /usr/bin/python3 \
      --reference tests/nn/pytorch_ddp_reference.py --workdir build/tests
prints one line per configuration and exits 1 on any difference.
"""

import argparse
import os
import subprocess
import sys

TOLERANCE = 1e-5
CONFIGURATIONS = ("mlp", "branch")
NPROC = 2
# Each of the two runs; CTest's TIMEOUT (180 s) covers both.
RUN_TIMEOUT_S = 80


def read_state(path):
    state = {}
    with open(path) as text:
        for line in text:
            fields = line.split()
            state[fields[0]] = [float(v) for v in fields[1:]]
    return state


def max_difference(a, b):
    """(largest |a - b|, parameter where it is); raises on different layouts."""
    if list(a) != list(b):
        raise ValueError("different parameters: %s vs %s" % (list(a), list(b)))
    worst = (0.0, "")
    for name in a:
        if len(a[name]) != len(b[name]):
            raise ValueError("%s has %d values vs %d" % (name, len(a[name]), len(b[name])))
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
        output = e.stdout or b""  # bytes here, even with text=True
        sys.stdout.write(output.decode(errors="replace") if isinstance(output, bytes) else output)
        print("FAILED: %s did not finish in %d s" % (what, RUN_TIMEOUT_S))
        return False
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        print("FAILED: %s exited with %d" % (what, result.returncode))
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    probe = subprocess.run(
        [args.python, "-c",
         "import torch, torch.distributed as d; assert d.is_gloo_available()"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        print("FAILED: %s cannot import torch with gloo (install Debian's python3-torch):\n%s"
              % (args.python, probe.stdout))
        return 1

    tag = str(os.getpid())
    ours = os.path.join(args.workdir, "ddp_pytorch_parity_%s_ours" % tag)
    theirs = os.path.join(args.workdir, "ddp_pytorch_parity_%s_torch" % tag)
    ok = run([args.ddprun, "--nproc-per-node", str(NPROC), args.ours, ours], "ours")
    ok = run([args.ddprun, "--nproc-per-node", str(NPROC), args.python, args.reference, theirs],
             "PyTorch") and ok
    if not ok:
        return 1

    status = 0
    for name in CONFIGURATIONS:
        try:
            ours_state = read_state("%s.%s.txt" % (ours, name))
            torch_state = read_state("%s.%s.txt" % (theirs, name))
            initial = read_state("%s.%s.initial.txt" % (theirs, name))
            difference, where = max_difference(ours_state, torch_state)
            moved, _ = max_difference(torch_state, initial)
        except (OSError, ValueError) as e:
            print("[FAILED] %s: %s" % (name, e))
            status = 1
            continue
        verdict = "ok" if difference <= TOLERANCE and moved > 100 * TOLERANCE else "FAILED"
        print("[%s] %s: max |ours - PyTorch| %.3g at %s (tolerance %g); training moved the "
              "weights by up to %.3g" % (verdict, name, difference, where, TOLERANCE, moved))
        if verdict != "ok":
            status = 1
    for path in os.listdir(args.workdir):
        if path.startswith("ddp_pytorch_parity_%s_" % tag):
            os.remove(os.path.join(args.workdir, path))
    return status


if __name__ == "__main__":
    sys.exit(main())
