"""Runs the DDP training-step benchmark of ddp and of PyTorch side by side.

Usage (run with Debian's interpreter, which has torch; it builds nothing):
  /usr/bin/python3 bench/run_ddp_step_bench.py [BUILD_DIR] [--rounds R]
      [--models toy,mlp] [--python PATH]
BUILD_DIR (default: build) must hold ddprun and bench/ddp_step_bench, as
built by `ninja -C BUILD_DIR ddprun ddp_step_bench`.

For each model (the tutorial ToyModel, and a 25M-parameter MLP; see the top of
ddp_step_bench.cpp) it launches three runs with our own ddprun, 2 ranks each:
  ddp    BUILD_DIR/bench/ddp_step_bench --mode ddp     (ddp::DistributedDataParallel)
  torch  /usr/bin/python3 bench/ddp_step_bench.py      (torch.nn.parallel.DistributedDataParallel)
  local  BUILD_DIR/bench/ddp_step_bench --mode local   (the plain module, no communication)

Noise: the runs of a model alternate, R rounds (default 2), the order
rotating each round, so that no side always runs first or last. Each side's
figure is the lowest of its per-round medians (other processes only ever add
time); the per-round medians are printed too, to show the spread.

Prints one table (median step time of each side, ddp/torch, and ddp's DDP
overhead over the same step without communication), ddp's communication
figures (from last_iteration_insight()), and a verdict per
target of the issue:
  toy: ddp's step time <= 0.8 x torch's;  mlp: ddp's step time <= 1.0 x torch's.
Exits 0 whether or not the targets are met (a benchmark reports, it does not
fail), 1 if a run fails, 2 on a bad command line or a missing build.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD_SIZE = 2
MODELS = ("toy", "mlp")
SIDES = ("ddp", "torch", "local")
# Highest acceptable ddp/torch step-time ratio, per model (from the issue).
TARGETS = {"toy": 0.8, "mlp": 1.0}
MODEL_NAMES = {"toy": "ToyModel (165 params, batch 20)",
               "mlp": "MLP 4x2500^2 (25.0M params, batch 8)"}

LINE = re.compile(r"^ddp_step_bench (impl=.*)$")


def parse_args():
    parser = argparse.ArgumentParser(
        description="DDP training step: ddp against PyTorch's DistributedDataParallel (Gloo).")
    parser.add_argument("build_dir", nargs="?", default="build",
                        help="build directory holding ddprun and bench/ddp_step_bench "
                             "(default: build)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each side per model, alternating (default: 2)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated, from toy,mlp (default: both)")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="interpreter with torch, for the torch side "
                             "(default: /usr/bin/python3)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1 (got %d)" % args.rounds)
    args.models = args.models.split(",")
    for model in args.models:
        if model not in MODELS:
            parser.error("--models: unknown model '%s' (expected toy or mlp)" % model)
    return args


def side_commands(args, model):
    """The three launch commands of one model, keyed by side."""
    ddprun = os.path.join(args.build_dir, "ddprun")
    bench = os.path.join(args.build_dir, "bench", "ddp_step_bench")
    for path in (ddprun, bench):
        if not os.access(path, os.X_OK):
            sys.stderr.write("run_ddp_step_bench.py: %s not found or not executable; build it "
                             "with `ninja -C %s ddprun ddp_step_bench` (or pass the build "
                             "directory as the first argument)\n" % (path, args.build_dir))
            sys.exit(2)
    launch = [ddprun, "--nproc-per-node", str(WORLD_SIZE), "--no-prefix"]
    return {
        "ddp": launch + [bench, "--model", model, "--mode", "ddp"],
        "torch": launch + [args.python, os.path.join(HERE, "ddp_step_bench.py"),
                           "--model", model, "--mode", "ddp"],
        "local": launch + [bench, "--model", model, "--mode", "local"],
    }


def run_side(side, command, env):
    """Runs one side once; returns the fields of its result line."""
    proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    for line in proc.stdout.splitlines():
        match = LINE.match(line)
        if match and proc.returncode == 0:
            return dict(item.split("=", 1) for item in match.group(1).split())
    sys.stderr.write("run_ddp_step_bench.py: the %s side failed (exit code %d): %s\n"
                     "--- its stdout ---\n%s--- its stderr ---\n%s"
                     % (side, proc.returncode, shlex.join(command), proc.stdout, proc.stderr))
    sys.exit(1)


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def main():
    args = parse_args()
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks share the cores; both sides also set 1 thread
    commands = {model: side_commands(args, model) for model in args.models}

    print("# DDP training step: ddp vs PyTorch DDP, Gloo, %d ranks, 1 thread each, CPU"
          % WORLD_SIZE)
    for model in args.models:
        for side in SIDES:
            print("# %-3s %-5s: OMP_NUM_THREADS=1 %s"
                  % (model, side, shlex.join(commands[model][side])))
    load_before = load_average()
    print("# %d rounds, order rotating each round; cores: %d, load average at start: %.2f"
          % (args.rounds, os.cpu_count() or 0, load_before), flush=True)

    # results[model][side] = [fields of each round]
    results = {model: {side: [] for side in SIDES} for model in args.models}
    loads = []
    for round_index in range(args.rounds):
        shift = round_index % len(SIDES)
        order = SIDES[shift:] + SIDES[:shift]
        for model in args.models:
            for side in order:
                loads.append(load_average())
                results[model][side].append(run_side(side, commands[model][side], env))
        print("# round %d/%d done (%s first), load average %.2f"
              % (round_index + 1, args.rounds, order[0], load_average()), flush=True)
    load_after = load_average()

    def best(model, side):
        return min(float(r["median_ms"]) for r in results[model][side])

    header = ("model", "ddp ms", "torch ms", "ddp/torch", "ddp no-comm ms",
              "DDP overhead (ddp/no-comm)")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
    for model in args.models:
        ours, theirs, local = best(model, "ddp"), best(model, "torch"), best(model, "local")
        print("| %s | %.3f | %.3f | %.2f | %.3f | %.2f |"
              % (MODEL_NAMES[model], ours, theirs, ours / theirs, local, ours / local))

    print()
    print("Per-round medians (ms), to show the spread; the table takes the lowest:")
    for model in args.models:
        print("  %-4s %s" % (model, "   ".join(
            "%s %s" % (side, " ".join(r["median_ms"] for r in results[model][side]))
            for side in SIDES)))

    print()
    print("ddp's step, rank 0, medians over the timed steps of last_iteration_insight(), "
          "per round:")
    for model in args.models:
        for r in results[model]["ddp"]:
            print("  %-4s step %s ms: forward %s ms, backward window %s ms, communication %s ms "
                  "(%.0f%% overlapped with backward), waited %s ms at the end of backward"
                  % (model, r["median_ms"], r["forward_ms"], r["backward_ms"], r["comm_ms"],
                     100 * float(r["overlap"]), r["comm_wait_ms"]))

    print()
    for model in args.models:
        ratio = best(model, "ddp") / best(model, "torch")
        print("%s target (ddp step <= %.1f x torch): %s (ratio %.2f)"
              % (model, TARGETS[model], "MET" if ratio <= TARGETS[model] else "MISSED", ratio))

    print("Load average: %.2f before the first run, %.2f to %.2f between runs, %.2f after "
          "the last, on %d cores." % (load_before, min(loads), max(loads), load_after,
                                      os.cpu_count() or 0))
    if load_before > 0.5:
        print("WARNING: the machine was busy before the benchmark started (load average "
              "%.2f); the figures are noisy, rerun on an idle machine." % load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
