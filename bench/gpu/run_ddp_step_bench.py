"""Runs the CUDA DDP step benchmark of ddp and of PyTorch side by side.

Usage (on a machine with a GPU and a PyTorch that has CUDA):
  python3 bench/gpu/run_ddp_step_bench.py [BUILD_DIR] [--rounds R] [--python PATH]
      [--cases CASE,...] [--iters N] [--warmup N]
BUILD_DIR (default: build) holds ddprun and bench/gpu_ddp_step_bench, built
with -DDDP_WITH_NCCL=ON (docs/gpu.md).

A case is MODEL:BACKEND:WORLD[:BATCH], e.g. toy:nccl:1 or mlp:gloo:2:4096;
the default is the four cases of docs/gpu.md: the ToyModel (batch 20) and the
25M MLP (4 x Linear(2500, 2500), batch 4096), each over NCCL with 1 rank and
over Gloo with 2 ranks sharing the one GPU. Each case runs both sides R
rounds (default 3), alternating which goes first; a side's figure is the
lowest of its per-round medians (other work only ever adds time).

Prints each run's result line, then a table of ddp's and PyTorch's step
times and their ratio (target: ddp/torch <= 1.0). Exits 0 when every run
worked, whatever the ratios; 1 when a run fails; 2 on a bad command line or
a missing build.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = "run_ddp_step_bench.py"
DEFAULT_CASES = "toy:nccl:1,mlp:nccl:1:4096,toy:gloo:2,mlp:gloo:2:4096"
LINE = r"^ddp_step_bench (impl=.*)$"


def parse_cases(text):
    cases = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) not in (3, 4) or parts[0] not in ("toy", "mlp") or \
                parts[1] not in ("nccl", "gloo") or not all(p.isdigit() for p in parts[2:]):
            raise argparse.ArgumentTypeError(
                "case '%s' is not MODEL:BACKEND:WORLD[:BATCH] (toy|mlp, nccl|gloo)" % item)
        batch = int(parts[3]) if len(parts) == 4 else (20 if parts[0] == "toy" else 4096)
        cases.append((parts[0], parts[1], int(parts[2]), batch))
    return cases


def main():
    parser = argparse.ArgumentParser(description="CUDA DDP step: ddp against PyTorch DDP")
    bench_common.add_common_arguments(parser, ["bench/gpu_ddp_step_bench"],
                                      "runs of each side per case, alternating (default: 3)")
    parser.set_defaults(rounds=3, python=sys.executable)
    parser.add_argument("--cases", type=parse_cases, default=parse_cases(DEFAULT_CASES),
                        help="comma-separated MODEL:BACKEND:WORLD[:BATCH] (default: %s)"
                        % DEFAULT_CASES)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    ddprun, bench = bench_common.built_programs(DRIVER, args.build_dir, ["bench/gpu_ddp_step_bench"])

    rows = []
    for model, backend, world, batch in args.cases:
        flags = ["--backend", backend, "--model", model, "--batch", str(batch),
                 "--iters", str(args.iters), "--warmup", str(args.warmup)]
        if model == "mlp":
            flags += ["--width", "2500", "--layers", "4"]
        commands = {
            "ddp": bench_common.launch(ddprun, world) + [bench] + flags,
            "torch": bench_common.launch(ddprun, world)
                     + [args.python, os.path.join(HERE, "ddp_step_bench.py")] + flags,
        }
        best = {}
        for round_index in range(args.rounds):
            order = ("ddp", "torch") if round_index % 2 == 0 else ("torch", "ddp")
            for side in order:
                fields = bench_common.run_side(DRIVER, side, commands[side], dict(os.environ), LINE)[0]
                print("ddp_step_bench " + " ".join("%s=%s" % kv for kv in fields.items()), flush=True)
                median = float(fields["median_ms"])
                best[side] = min(best.get(side, median), median)
        rows.append(("%s %s world=%d" % (model, backend, world), str(batch),
                     "%.3f" % best["ddp"], "%.3f" % best["torch"],
                     "%.2f" % (best["ddp"] / best["torch"])))

    print()
    bench_common.print_table(("case", "batch", "ddp ms", "torch ms", "ddp/torch"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
