"""Runs the DDP training-step benchmark of ddp (MPI and Gloo) and of PyTorch
side by side.

Usage (any python3; it builds nothing):
  python3 bench/run_ddp_step_bench.py [BUILD_DIR] [--rounds R]
      [--models toy,mlp] [--sides mpi,local-mpi,...] [--python PATH]
      [--python-old PATH|none] [--mpirun PATH] [--no-mpi]
BUILD_DIR (default: build) must hold ddprun and bench/ddp_step_bench, as
built by `ninja -C BUILD_DIR ddprun ddp_step_bench`. --python is current
PyTorch, the reference (default: the torch 2.11 venv that scripts/compat.sh
keeps, ~/.cache/ddp/torch-2.11.0, when it exists); --python-old is Debian's
PyTorch 1.13, measured beside it (default /usr/bin/python3; none leaves it out).

For each model (the tutorial ToyModel, and a 25M-parameter MLP; see the top of
ddp_step_bench.cpp) it launches these runs, 2 ranks each:
  mpi         DDP_BACKEND=mpi mpirun -np 2 BUILD_DIR/bench/ddp_step_bench --mode ddp
              (ddp::DistributedDataParallel on ddp's MPI backend)
  mpi-view    the same with --gradient-as-bucket-view 1 (the DDP option that
              makes gradients views into the buckets: no copy in and out)
  local-mpi   mpirun -np 2 BUILD_DIR/bench/ddp_step_bench --mode local
              (the plain module, no communication, started as the mpi run is)
  gloo        ddprun ... BUILD_DIR/bench/ddp_step_bench --mode ddp (ddp's Gloo backend)
  gloo-view   the same with --gradient-as-bucket-view 1
  gloo-tcp    gloo with DDP_GLOO_SHM=0: the buckets over TCP, not shared memory
  gloo-buckets gloo with DDP_CROSS_MEMORY=0: the gradients copied into the shared
              buckets and back, not read where they lie
  torch       ddprun ... PYTHON bench/ddp_step_bench.py --mode ddp
              (torch.nn.parallel.DistributedDataParallel, Gloo; current PyTorch)
  torch-local ddprun ... PYTHON bench/ddp_step_bench.py --mode local
              (current PyTorch's step with no communication)
  torch-old   ddprun ... PYTHON_OLD bench/ddp_step_bench.py --mode ddp (PyTorch 1.13's DDP)
  local       ddprun ... BUILD_DIR/bench/ddp_step_bench --mode local
--no-mpi leaves out the first three; --sides picks some (e.g. mpi,torch:
the pair of the MPI MLP target).

Noise: the runs of a model alternate, R rounds (default 2), the order
rotating each round, so that no side always runs first or last. Each side's
figure is the lowest of its per-round medians (other processes only ever add
time); the per-round medians are printed too, to show the spread.

Prints the versions and the BLAS of each side, one table (median step time of
each side, the ratios to torch, and each backend's DDP overhead over the same
step without communication, started the same way), ddp's communication
figures (from last_iteration_insight()), and a verdict per target (TARGETS
below):
  toy: ddp-MPI's step <= 0.3 x torch's;  ddp-Gloo's step <= 0.8 x torch's;
  mlp: ddp's local step <= 1.1 x torch's local step; ddp-Gloo's DDP step
       <= 0.75 x torch's; ddp-MPI's <= 0.65 x torch's (with the default
       options, and reported beside it with gradient_as_bucket_view); and,
       for the record, ddp-MPI's step against its own step without
       communication (<= 1.10).
A side that prints its figures and then fails at exit (PyTorch 2.11's Gloo
group can abort in interpreter shutdown) keeps its figures; the failure is
reported. Exits 0 whether or not the targets are met (a benchmark reports, it
does not fail), 1 if a run fails before printing its figures, 2 on a bad
command line or a missing build.
"""

import argparse
import os
import shlex
import sys

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD_SIZE = 2
MODELS = ("toy", "mlp")
ALL_SIDES = ("mpi", "mpi-view", "local-mpi", "gloo", "gloo-view", "gloo-tcp", "gloo-buckets", "torch",
             "torch-local", "torch-old", "local")
# (model, side, the side it is compared with, the highest acceptable ratio).
TARGETS = (
    ("toy", "mpi", "torch", 0.3),
    ("toy", "mpi-view", "torch", 0.3),
    ("toy", "gloo", "torch", 0.8),
    ("mlp", "local", "torch-local", 1.1),
    ("mlp", "gloo", "torch", 0.75),
    ("mlp", "gloo-view", "torch", 0.75),
    ("mlp", "mpi", "torch", 0.65),
    ("mlp", "mpi-view", "torch", 0.65),
    ("mlp", "mpi", "local-mpi", 1.10),
    ("mlp", "mpi-view", "local-mpi", 1.10),
)
MODEL_NAMES = {"toy": "ToyModel (165 params, batch 20)",
               "mlp": "MLP 4x2500^2 (25.0M params, batch 8)"}

LINE = r"^ddp_step_bench (impl=.*)$"


def parse_args():
    parser = argparse.ArgumentParser(
        description="DDP training step: ddp against PyTorch's DistributedDataParallel (Gloo).")
    bench_common.add_common_arguments(parser, ["bench/ddp_step_bench"],
                                      "runs of each side per model, alternating (default: 2)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated, from toy,mlp (default: both)")
    parser.add_argument("--sides", default=",".join(ALL_SIDES),
                        help="comma-separated, from %s (default: all)" % ",".join(ALL_SIDES))
    parser.add_argument("--python-old", default="/usr/bin/python3",
                        help="a second PyTorch, measured beside --python (default: Debian's "
                        "/usr/bin/python3, PyTorch 1.13); 'none' leaves it out")
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    if args.python_old == "none" or args.python_old == args.python:
        args.python_old = None
    args.models = args.models.split(",")
    for model in args.models:
        if model not in MODELS:
            parser.error("--models: unknown model '%s' (expected toy or mlp)" % model)
    args.sides = args.sides.split(",")
    for side in args.sides:
        if side not in ALL_SIDES:
            parser.error("--sides: unknown side '%s' (expected one of %s)"
                         % (side, ",".join(ALL_SIDES)))
        if args.no_mpi and side in ("mpi", "mpi-view", "local-mpi"):
            parser.error("--sides: '%s' needs the MPI side, which --no-mpi leaves out" % side)
        if side == "torch-old" and args.python_old is None:
            parser.error("--sides: 'torch-old' needs --python-old")
    if args.python_old is None and "torch-old" in args.sides:
        args.sides.remove("torch-old")
    return args


def side_commands(args, model, env):
    """{side: (command, environment)} of one model."""
    driver = "run_ddp_step_bench.py"
    ddprun, bench = bench_common.built_programs(driver, args.build_dir, ["bench/ddp_step_bench"])
    launch = bench_common.launch(ddprun, WORLD_SIZE)
    sides = {}
    if not args.no_mpi:
        mpirun = bench_common.mpi_launch(driver, args.mpirun, WORLD_SIZE)
        mpi_env = bench_common.mpi_env(env)
        sides["mpi"] = (mpirun + [bench, "--model", model, "--mode", "ddp"], mpi_env)
        sides["mpi-view"] = (mpirun + [bench, "--model", model, "--mode", "ddp",
                                       "--gradient-as-bucket-view", "1"], mpi_env)
        sides["local-mpi"] = (mpirun + [bench, "--model", model, "--mode", "local"], mpi_env)
    sides["gloo"] = (launch + [bench, "--model", model, "--mode", "ddp"], env)
    sides["gloo-view"] = (launch + [bench, "--model", model, "--mode", "ddp",
                                    "--gradient-as-bucket-view", "1"], env)
    tcp_env = dict(env)
    tcp_env["DDP_GLOO_SHM"] = "0"
    sides["gloo-tcp"] = (launch + [bench, "--model", model, "--mode", "ddp"], tcp_env)
    buckets_env = dict(env)
    buckets_env["DDP_CROSS_MEMORY"] = "0"
    sides["gloo-buckets"] = (launch + [bench, "--model", model, "--mode", "ddp"], buckets_env)
    script = os.path.join(HERE, "ddp_step_bench.py")
    sides["torch"] = (launch + [args.python, script, "--model", model, "--mode", "ddp"], env)
    sides["torch-local"] = (launch + [args.python, script, "--model", model, "--mode", "local"],
                            env)
    if args.python_old is not None:
        sides["torch-old"] = (launch + [args.python_old, script, "--model", model, "--mode", "ddp"],
                              env)
    sides["local"] = (launch + [bench, "--model", model, "--mode", "local"], env)
    return sides


def run_side(side, command, env):
    """Runs one side once; returns the fields of its result line."""
    return bench_common.run_side("run_ddp_step_bench.py", side, command, env, LINE)[0]


def main():
    args = parse_args()
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks share the cores; every side also sets 1 thread
    commands = {model: side_commands(args, model, env) for model in args.models}
    sides = [side for side in ALL_SIDES
             if side in commands[args.models[0]] and side in args.sides]

    versions = {"torch": bench_common.torch_version(args.python)}
    if args.python_old is not None:
        versions["torch-old"] = bench_common.torch_version(args.python_old)
    for side, version in versions.items():
        if version is None:
            sys.stderr.write("run_ddp_step_bench.py: the %s side's interpreter cannot import "
                             "torch\n" % side)
            return 2
    print("# DDP training step: ddp (%s) vs PyTorch %s DDP (Gloo)%s, %d ranks, 1 thread each, CPU"
          % ("MPI, Gloo" if "mpi" in sides else "Gloo", versions["torch"],
             " and PyTorch %s's" % versions["torch-old"] if "torch-old" in versions else "",
             WORLD_SIZE))
    for model in args.models:
        for side in sides:
            command, side_env = commands[model][side]
            prefix = "DDP_BACKEND=mpi " if side_env.get("DDP_BACKEND") == "mpi" else ""
            print("# %-3s %-9s: OMP_NUM_THREADS=1 %s%s"
                  % (model, side, prefix, shlex.join(command)))
    load_before = bench_common.load_average()
    print("# %d rounds, order rotating each round; cores: %d, load average at start: %.2f"
          % (args.rounds, os.cpu_count() or 0, load_before), flush=True)

    # results[model][side] = [fields of each round]
    results = {model: {side: [] for side in sides} for model in args.models}
    loads = []
    for round_index in range(args.rounds):
        shift = round_index % len(sides)
        order = sides[shift:] + sides[:shift]
        for model in args.models:
            for side in order:
                loads.append(bench_common.load_average())
                command, side_env = commands[model][side]
                results[model][side].append(run_side(side, command, side_env))
        print("# round %d/%d done (%s first), load average %.2f"
              % (round_index + 1, args.rounds, order[0], bench_common.load_average()), flush=True)
    load_after = bench_common.load_average()

    def best(model, side):
        return min(float(r["median_ms"]) for r in results[model][side])

    print()
    print("Versions and BLAS, as each side reported them:")
    for side in sides:
        first = results[args.models[0]][side][0]
        exits = sorted({r["exit"] for model in args.models for r in results[model][side]
                        if "exit" in r})
        print("  %-11s %s %s, BLAS %s%s%s"
              % (side, "ddp on LibTorch" if first["impl"] == "ddp" else "PyTorch",
                 first.get("torch", "?"), first.get("blas", "?"),
                 " (BLAS threads: %s)" % first["blas_threads"] if "blas_threads" in first else "",
                 "; exited with code %s after printing its figures" % ",".join(exits)
                 if exits else ""))

    ours = [side for side in ("mpi", "mpi-view", "gloo", "gloo-view", "gloo-tcp", "gloo-buckets")
            if side in sides]
    baseline = {"mpi": "local-mpi", "mpi-view": "local-mpi", "gloo": "local", "gloo-view": "local",
                "gloo-tcp": "local", "gloo-buckets": "local"}
    to_torch = [side for side in ours if "torch" in sides]
    to_local = [side for side in ours if baseline[side] in sides]
    local_pair = "local" in sides and "torch-local" in sides
    header = (["model"] + ["%s ms" % side for side in sides]
              + ["%s/torch" % side for side in to_torch]
              + ["%s/%s" % (side, baseline[side]) for side in to_local]
              + (["local/torch-local"] if local_pair else []))
    rows = []
    for model in args.models:
        row = [MODEL_NAMES[model]] + ["%.3f" % best(model, side) for side in sides]
        row += ["%.2f" % (best(model, side) / best(model, "torch")) for side in to_torch]
        row += ["%.2f" % (best(model, side) / best(model, baseline[side])) for side in to_local]
        if local_pair:
            row.append("%.2f" % (best(model, "local") / best(model, "torch-local")))
        rows.append(tuple(row))
    print()
    bench_common.print_table(header, rows)

    print()
    print("Per-round medians (ms), to show the spread; the table takes the lowest:")
    for model in args.models:
        print("  %-4s %s" % (model, "   ".join(
            "%s %s" % (side, " ".join(r["median_ms"] for r in results[model][side]))
            for side in sides)))

    print()
    print("ddp's step, rank 0, medians over the timed steps of last_iteration_insight(), "
          "per round:")
    for model in args.models:
        for side in ours:
            for r in results[model][side]:
                print("  %-4s %-8s step %s ms: forward %s ms, backward window %s ms, "
                      "communication %s ms (%.0f%% overlapped with backward), waited %s ms at "
                      "the end of backward"
                      % (model, side, r["median_ms"], r["forward_ms"], r["backward_ms"],
                         r["comm_ms"], 100 * float(r["overlap"]), r["comm_wait_ms"]))

    print()
    for model, side, other, limit in TARGETS:
        if model not in args.models or side not in sides:
            continue
        if other not in sides:
            print("%s target (ddp-%s step <= %.2f x %s): not measured (--sides)"
                  % (model, side, limit, other))
            continue
        ratio = best(model, side) / best(model, other)
        print("%s target (ddp-%s step <= %.2f x %s): %s (ratio %.2f)"
              % (model, side, limit, other, "MET" if ratio <= limit else "MISSED", ratio))

    print("Load average: %.2f before the first run, %.2f to %.2f between runs, %.2f after "
          "the last, on %d cores." % (load_before, min(loads), max(loads), load_after,
                                      os.cpu_count() or 0))
    bench_common.warn_if_busy(load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
