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
import shlex
import sys

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD_SIZE = 2
MODELS = ("toy", "mlp")
SIDES = ("ddp", "torch", "local")
# Highest acceptable ddp/torch step-time ratio, per model (from the issue).
TARGETS = {"toy": 0.8, "mlp": 1.0}
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
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    args.models = args.models.split(",")
    for model in args.models:
        if model not in MODELS:
            parser.error("--models: unknown model '%s' (expected toy or mlp)" % model)
    return args


def side_commands(args, model):
    """The three launch commands of one model, keyed by side."""
    ddprun, bench = bench_common.built_programs("run_ddp_step_bench.py", args.build_dir,
                                                ["bench/ddp_step_bench"])
    launch = bench_common.launch(ddprun, WORLD_SIZE)
    return {
        "ddp": launch + [bench, "--model", model, "--mode", "ddp"],
        "torch": launch + [args.python, os.path.join(HERE, "ddp_step_bench.py"),
                           "--model", model, "--mode", "ddp"],
        "local": launch + [bench, "--model", model, "--mode", "local"],
    }


def run_side(side, command, env):
    """Runs one side once; returns the fields of its result line."""
    return bench_common.run_side("run_ddp_step_bench.py", side, command, env, LINE)[0]


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
    load_before = bench_common.load_average()
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
                loads.append(bench_common.load_average())
                results[model][side].append(run_side(side, commands[model][side], env))
        print("# round %d/%d done (%s first), load average %.2f"
              % (round_index + 1, args.rounds, order[0], bench_common.load_average()), flush=True)
    load_after = bench_common.load_average()

    def best(model, side):
        return min(float(r["median_ms"]) for r in results[model][side])

    header = ("model", "ddp ms", "torch ms", "ddp/torch", "ddp no-comm ms",
              "DDP overhead (ddp/no-comm)")
    rows = []
    for model in args.models:
        ours, theirs, local = best(model, "ddp"), best(model, "torch"), best(model, "local")
        rows.append((MODEL_NAMES[model], "%.3f" % ours, "%.3f" % theirs, "%.2f" % (ours / theirs),
                     "%.3f" % local, "%.2f" % (ours / local)))
    print()
    bench_common.print_table(header, rows)

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
    bench_common.warn_if_busy(load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
