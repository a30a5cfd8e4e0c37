"""Parity of ddp's DistributedDataParallel with PyTorch's own.

Runs ddp_pytorch_parity_main and pytorch_ddp_reference.py, each under
ddprun with --nproc ranks, and compares what rank 0 of each wrote:

- a training configuration: the final parameters and buffers must agree to
  1e-5, training must have moved them well beyond that, and the same
  gradients must be defined (an unused parameter's stays undefined);
- a refused configuration (a module with nothing to train): both sides must
  raise, ours with a message of the house shape ("[rank 0/W] ...") saying
  what PyTorch's says.

Where the reference could not run a configuration under PyTorch's DDP (it
writes OUT.<configuration>.note.txt, e.g. two forwards before one backward,
which PyTorch 1.13 and 2.11 reject), its numbers are the one-process result
that the note describes, and ours are compared with those. Fails (does not
skip) when the Python interpreter has no torch with gloo.

Usage (registered with CTest as ddp_pytorch_parity and
ddp_pytorch_parity_3_ranks):
  /usr/bin/python3 tests/nn/pytorch_parity_driver.py --ddprun build/ddprun \
      --ours build/tests/ddp_pytorch_parity_main --python /usr/bin/python3 \
      --reference tests/nn/pytorch_ddp_reference.py --workdir build/tests --nproc 2
prints one line per configuration and exits 1 on any difference.
"""

import argparse
import os
import subprocess
import sys

TOLERANCE = 1e-5
# The configurations, in the order both programs run them (see their
# docstrings), and what each checks.
TRAINED = (
    "mlp",              # the plain case
    "powersgd_rank1",   # the PowerSGD hook, rank 1, against powerSGD_hook (same random Q)
    "powersgd_rank2",   # the PowerSGD hook, rank 2 (the last layer goes uncompressed)
    "powersgd_same_shape",  # rank 1, batch_tensors_with_same_shape (two 16 x 16 weights)
    "batched_powersgd",     # batched_powerSGD_hook: the bucket as one padded square
    "post_local_sgd",       # post_localSGD_hook from step 2 + PeriodicModelAverager
    "post_local_sgd_optimizer",  # the same through PostLocalSGDOptimizer
    "branch",           # a layer that forward never uses (find_unused_parameters)
    "unused_output",    # an output that the loss does not use (find_unused_parameters)
    "no_sync_buffers",  # BatchNorm statistics after no_sync: no broadcast after it
    "join_buffers",     # BatchNorm under Join: broadcast from the highest training rank
    "join_unused",      # Join: a joined rank's last usage map counts
    "join_divide_active",  # Join, divide_by_initial_world_size=False: the mean over the ranks training
    "ignored_params",   # params_and_buffers_to_ignore: the first Linear neither broadcast nor reduced
    "two_forwards",     # two forwards of a BatchNorm model before one backward
    "embedding",        # sparse gradients: an Embedding(sparse=True), Gloo's sparse allreduce
    "embedding_bag",    # sparse gradients: an EmbeddingBag(sparse=True)
    "sync_batch_norm",  # SyncBatchNorm: the statistics of the global batch
    "sync_batch_norm_uneven",  # SyncBatchNorm2d on uneven slices (an empty one on 3 ranks)
    "static_twice",     # static_graph: a layer run twice under reentrant checkpoints
    "static_unused",    # static_graph: a layer never used (gradient_as_bucket_view)
    "static_join",      # static_graph under Join: rank 0 alone uses a layer, joins first
    "zero_adam",        # ZeroRedundancyOptimizer with Adam
    "zero_sgd_groups",  # ZeroRedundancyOptimizer, SGD, two groups, parameters as bucket views
    "complex_params",   # a complex parameter: its gradient reduced as pairs of reals
)
# Tighter tolerances: PowerSGD moves the rank-2 result only about 1e-5 away
# from plain averaging here, so 1e-5 would not tell them apart (ours matches
# PyTorch's powerSGD_hook to 0 on 2 ranks, 7.5e-9 on 3).
TOLERANCE_OF = {"powersgd_rank1": 1e-7, "powersgd_rank2": 1e-7, "powersgd_same_shape": 1e-7,
                "batched_powersgd": 1e-7}
REFUSED = (
    "no_parameters",    # a module without parameters
    "frozen",           # a module whose parameters are all frozen
)
# The phrase of PyTorch's refusal that ours must say too.
REFUSAL_PHRASE = "parameter that requires a gradient"
GRAD_SUFFIX = ".grad_defined"
# Each of the two runs; CTest's TIMEOUT covers both.
RUN_TIMEOUT_S = 110


def read_state(path):
    """(values by name, gradient-defined flags by parameter name)."""
    values, grads = {}, {}
    with open(path) as text:
        for line in text:
            fields = line.split()
            if fields[0].endswith(GRAD_SUFFIX):
                grads[fields[0][:-len(GRAD_SUFFIX)]] = fields[1] == "1"
            else:
                values[fields[0]] = [float(v) for v in fields[1:]]
    return values, grads


def read_text(path):
    with open(path) as text:
        return text.read().strip()


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


def check_trained(name, ours, theirs):
    """[problems], summary."""
    ours_state, ours_grads = read_state("%s.%s.txt" % (ours, name))
    torch_state, torch_grads = read_state("%s.%s.txt" % (theirs, name))
    initial, _ = read_state("%s.%s.initial.txt" % (theirs, name))
    tolerance = TOLERANCE_OF.get(name, TOLERANCE)
    difference, where = max_difference(ours_state, torch_state)
    # Parameters only: a buffer such as num_batches_tracked moves anyway.
    moved, _ = max_difference({p: torch_state[p] for p in torch_grads},
                              {p: initial[p] for p in torch_grads})
    problems = []
    if difference > tolerance:
        problems.append("max |ours - PyTorch| %.3g at %s (tolerance %g)"
                        % (difference, where, tolerance))
    if moved <= 100 * TOLERANCE:
        problems.append("training moved the weights by only %.3g: the check proves nothing"
                        % moved)
    if ours_grads != torch_grads:
        differ = [p for p in torch_grads if ours_grads.get(p) != torch_grads[p]]
        problems.append("gradients defined differently: %s" % ", ".join(
            "%s (ours %s, PyTorch %s)" % (p, ours_grads.get(p), torch_grads[p]) for p in differ))
    undefined = [p for p, defined in torch_grads.items() if not defined]
    summary = ("max |ours - PyTorch| %.3g at %s (tolerance %g); training moved the weights by "
               "up to %.3g; undefined gradients: %s"
               % (difference, where, tolerance, moved, ", ".join(undefined) or "none"))
    note = "%s.%s.note.txt" % (theirs, name)
    if os.path.exists(note):
        summary += "; the reference's numbers are not PyTorch DDP's: " + read_text(note)
    return problems, summary


def check_refused(name, ours, theirs, nproc):
    theirs_error = "%s.%s.error.txt" % (theirs, name)
    ours_error = "%s.%s.error.txt" % (ours, name)
    problems = []
    if not os.path.exists(theirs_error):
        problems.append("PyTorch accepted the module (expected it to refuse)")
        return problems, ""
    torch_message = read_text(theirs_error)
    if not os.path.exists(ours_error):
        problems.append("ours accepted the module; PyTorch said: " + torch_message)
        return problems, ""
    ours_message = read_text(ours_error)
    if REFUSAL_PHRASE not in torch_message:
        problems.append("PyTorch's message changed (no '%s'): %s" % (REFUSAL_PHRASE, torch_message))
    if REFUSAL_PHRASE not in ours_message:
        problems.append("our message does not say '%s': %s" % (REFUSAL_PHRASE, ours_message))
    if not ours_message.startswith("[rank 0/%d] DistributedDataParallel" % nproc):
        problems.append("our message does not start with [rank 0/%d]: %s" % (nproc, ours_message))
    return problems, "both refuse; ours: %s | PyTorch: %s" % (ours_message, torch_message)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()

    probe = subprocess.run(
        [args.python, "-c",
         "import torch, torch.distributed as d; assert d.is_gloo_available()"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        print("FAILED: %s cannot import torch with gloo (install Debian's python3-torch):\n%s"
              % (args.python, probe.stdout))
        return 1

    tag = "%d_%d" % (os.getpid(), args.nproc)
    ours = os.path.join(args.workdir, "ddp_pytorch_parity_%s_ours" % tag)
    theirs = os.path.join(args.workdir, "ddp_pytorch_parity_%s_torch" % tag)
    ok = run([args.ddprun, "--nproc-per-node", str(args.nproc), args.ours, ours], "ours")
    ok = run([args.ddprun, "--nproc-per-node", str(args.nproc), args.python, args.reference,
              theirs], "PyTorch") and ok
    if not ok:
        return 1

    status = 0
    for name in TRAINED + REFUSED:
        try:
            if name in TRAINED:
                problems, summary = check_trained(name, ours, theirs)
            else:
                problems, summary = check_refused(name, ours, theirs, args.nproc)
        except (OSError, ValueError) as e:
            problems, summary = [str(e)], ""
        for problem in problems:
            print("[FAILED] %s: %s" % (name, problem))
        if problems:
            status = 1
        else:
            print("[ok] %s: %s" % (name, summary))
    for path in os.listdir(args.workdir):
        if path.startswith("ddp_pytorch_parity_%s_" % tag):
            os.remove(os.path.join(args.workdir, path))
    return status


if __name__ == "__main__":
    sys.exit(main())
