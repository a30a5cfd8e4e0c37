"""Runs the DCP benchmark of ddp (bench/dcp_bench.cpp) and of PyTorch
(bench/dcp_bench.py) side by side and prints the figures and the ratios.

Usage (any python3; it builds nothing):
  python3 bench/run_dcp_bench.py [BUILD_DIR] [--rounds R] [--width W]
      [--layers L] [--dir DIR] [--python PATH]
BUILD_DIR (default: build) must hold ddprun and bench/dcp_bench. --python is
PyTorch's side (default: the torch 2.11 venv that scripts/compat.sh keeps in
~/.cache/ddp, when it exists; else /usr/bin/python3); it needs PyTorch 2.x
with FSDP2 (fully_shard).

Both sides: 2 ranks (Gloo, one thread each), Sequential of L Linear(W, W)
(8 x 4096 by default: 134M parameters, 537 MB) under FSDP (kFullShard; FSDP2
on PyTorch's side), Adam with its state, so that each rank holds 805 MB of
parameters and state; a save to DIR then a load from it, R times (default 3,
the sides alternating as whole runs of R rounds). Times are the slowest
rank's; the figure is the lowest of the rounds (other processes only ever add
time). Memory is each rank's peak resident set during the call over its
resident set before it: what saving or loading costs beyond the rank's own
shard; the goal is at most one piece (the largest box of a parameter that one
rank writes) beyond it. Exits 0 whatever the figures, 1 if a side fails.
"""

import argparse
import os
import shutil
import sys
import tempfile

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = "run_dcp_bench.py"
LINE = r"^dcp_bench (impl=.*)$"
WORLD_SIZE = 2


def main():
    parser = argparse.ArgumentParser(description="DCP save and load: ddp against torch.distributed.checkpoint.")
    bench_common.add_common_arguments(parser, ["bench/dcp_bench"], "rounds of save and load per side (default 2)")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dir", default="", help="where the checkpoints go (default: a new folder under /tmp)")
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    ddprun, bench = bench_common.built_programs(DRIVER, args.build_dir, ["bench/dcp_bench"])
    python = args.python or bench_common.default_python()
    work = args.dir or tempfile.mkdtemp(prefix="ddp-dcp-bench.")
    load_before = bench_common.load_average()
    print("# dcp_bench: %d ranks, %d x Linear(%d, %d), Adam; PyTorch %s (%s); checkpoints in %s"
          % (WORLD_SIZE, args.layers, args.width, args.width, bench_common.torch_version(python), python, work))
    common = ["--width", str(args.width), "--layers", str(args.layers), "--rounds", str(args.rounds)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sides = {
        "ddp": bench_common.launch(ddprun, WORLD_SIZE) + [bench, "--dir", os.path.join(work, "ddp")] + common,
        "torch": bench_common.launch(ddprun, WORLD_SIZE)
        + [python, os.path.join(HERE, "dcp_bench.py"), "--dir", os.path.join(work, "torch")] + common,
    }
    results = {}
    for side, command in sides.items():
        results[side] = bench_common.run_side(DRIVER, side, command, env, LINE)
        shutil.rmtree(os.path.join(work, side), ignore_errors=True)
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)

    def figure(side, key, reduce):
        return reduce(float(r[key]) for r in results[side])

    rows = []
    for label, key, reduce in [("save, s (lowest round)", "save_s", min), ("load, s (lowest round)", "load_s", min),
                               ("save: peak extra memory per rank, MB (highest)", "save_extra_mb", max),
                               ("load: peak extra memory per rank, MB (highest)", "load_extra_mb", max)]:
        ours, theirs = figure("ddp", key, reduce), figure("torch", key, reduce)
        ratio = ours / theirs if theirs > 0 else float("nan")
        rows.append([label, "%.2f" % ours, "%.2f" % theirs, "%.2f" % ratio])
    bench_common.print_table(["figure", "ddp", "PyTorch", "ddp / PyTorch"], rows)
    first = results["ddp"][0]
    print("params=%s shard_mb_per_rank=%s largest_piece_mb=%s"
          % (first["params"], first["shard_mb"], first["largest_piece_mb"]))
    for side in sides:
        print("# %s per round: save %s s, load %s s" % (
            side, " ".join(r["save_s"] for r in results[side] if r["rank"] == "0"),
            " ".join(r["load_s"] for r in results[side] if r["rank"] == "0")))
    bench_common.warn_if_busy(load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
