"""Runs the allreduce benchmark of ddp (MPI and Gloo) and of torch.distributed
(Gloo) side by side.

Usage (any python3; it builds nothing):
  python3 bench/run_allreduce_bench.py [BUILD_DIR] [--rounds R]
      [--sizes 4K,1M,...] [--iters N] [--warmup N] [--python PATH]
      [--mpirun PATH] [--no-mpi]
BUILD_DIR (default: build) must hold ddprun and bench/allreduce_bench, as
built by `ninja -C BUILD_DIR ddprun allreduce_bench`. --python is PyTorch's
side (default: current PyTorch, the torch 2.11 venv that scripts/compat.sh
keeps in ~/.cache/ddp, when it exists; else Debian's /usr/bin/python3).

Three sides, 2 ranks each, with the same methodology (see the top of
allreduce_bench.cpp), each sweeping 4 KiB to 64 MiB of float32:
  mpi:   BUILD_DIR/bench/allreduce_bench under `mpirun -np 2` with
         DDP_BACKEND=mpi (ddp's MPI backend; --no-mpi leaves it out);
  gloo:  the same binary under our ddprun (ddp's Gloo backend);
  torch: bench/allreduce_bench.py under our ddprun (torch.distributed, Gloo).

Noise: the sides alternate as whole sweeps, R rounds (default 2), the order
rotating each round, so that no side always runs first or last. For each size
and side, the reported latency is the lowest of its per-round medians: other
processes only ever add time, so the best round is the one least disturbed.
The per-round medians are printed too, to show the spread.

Prints one table (latency and bus bandwidth of each side, and the ratios to
torch) and a verdict for each target:
  MPI latency:     ddp-MPI's latency <= 0.05 x torch's at 4 KiB;
  MPI throughput:  ddp-MPI's bus bandwidth >= 2 x torch's at 1 MiB and above;
  Gloo latency:    ddp-Gloo's latency <= torch's at 4 KiB;
  Gloo throughput: ddp-Gloo's bus bandwidth >= torch's at 1 MiB and above.
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
KIB = 1024
MIB = 1024 * KIB
THROUGHPUT_TARGET_MIN_BYTES = 1 * MIB
LATENCY_TARGET_BYTES = 4 * KIB

# side: (the factor on torch's latency it must stay under at 4 KiB, the
# factor on torch's bus bandwidth it must reach from 1 MiB on)
TARGETS = {"mpi": (0.05, 2.0), "gloo": (1.0, 1.0)}

LINE = r"^allreduce_bench (impl=.*)$"


def parse_args():
    parser = argparse.ArgumentParser(
        description="Allreduce latency and bus bandwidth: ddp (MPI, Gloo) against "
                    "torch.distributed (Gloo).")
    bench_common.add_common_arguments(parser, ["bench/allreduce_bench"],
                                      "sweeps of each side, alternating (default: 2)")
    parser.add_argument("--sizes", help="passed to every side, e.g. 4K,1M (default: theirs)")
    parser.add_argument("--iters", help="passed to every side (default: from the size)")
    parser.add_argument("--warmup", help="passed to every side (default: from --iters)")
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    return args


def side_commands(args, env):
    """{side: (command, environment)} of the sides to run."""
    driver = "run_allreduce_bench.py"
    ddprun, bench = bench_common.built_programs(driver, args.build_dir, ["bench/allreduce_bench"])
    extra = []
    for flag in ("sizes", "iters", "warmup"):
        value = getattr(args, flag)
        if value is not None:
            extra += ["--" + flag, value]
    launch = bench_common.launch(ddprun, WORLD_SIZE)
    sides = {}
    if not args.no_mpi:
        sides["mpi"] = (bench_common.mpi_launch(driver, args.mpirun, WORLD_SIZE) + [bench] + extra,
                        bench_common.mpi_env(env))
    sides["gloo"] = (launch + [bench] + extra, env)
    sides["torch"] = (launch + [args.python, os.path.join(HERE, "allreduce_bench.py")] + extra, env)
    return sides


def run_side(side, command, env):
    """Runs one sweep; returns {bytes: fields} from its result lines."""
    lines = bench_common.run_side("run_allreduce_bench.py", side, command, env, LINE)
    return {int(fields["bytes"]): fields for fields in lines}


def size_name(nbytes):
    if nbytes >= MIB and nbytes % MIB == 0:
        return "%d MiB" % (nbytes // MIB)
    if nbytes >= KIB and nbytes % KIB == 0:
        return "%d KiB" % (nbytes // KIB)
    return "%d B" % nbytes


def busbw_gbps(nbytes, seconds):
    return 2.0 * (WORLD_SIZE - 1) / WORLD_SIZE * nbytes / seconds / 1e9


def print_verdicts(side, best, sizes):
    """The two targets of ddp's `side` against torch, from the best medians."""
    latency_factor, bandwidth_factor = TARGETS[side]
    name = side.upper() if side == "mpi" else side.capitalize()
    if LATENCY_TARGET_BYTES in sizes:
        ours, theirs = best[side][LATENCY_TARGET_BYTES], best["torch"][LATENCY_TARGET_BYTES]
        ratio = ours / theirs
        print("%s latency target (ddp-%s <= %.2f x torch at 4 KiB): %s (%.1f us vs %.1f us, "
              "ratio %.3f)" % (name, side, latency_factor,
                               "MET" if ratio <= latency_factor else "MISSED",
                               ours * 1e6, theirs * 1e6, ratio))
    else:
        print("%s latency target: not measured (4 KiB not in --sizes)" % name)
    big = [n for n in sizes if n >= THROUGHPUT_TARGET_MIN_BYTES]
    if not big:
        print("%s throughput target: not measured (no size of 1 MiB or more)" % name)
        return
    # The bus bandwidth ratio is the inverse of the latency ratio.
    ratios = {n: best["torch"][n] / best[side][n] for n in big}
    missed = [n for n in big if ratios[n] < bandwidth_factor]
    if missed:
        print("%s throughput target (ddp-%s busbw >= %.1f x torch at >= 1 MiB): MISSED at %s "
              "(ratio %s)" % (name, side, bandwidth_factor, ", ".join(size_name(n) for n in missed),
                              ", ".join("%.2f" % ratios[n] for n in missed)))
    else:
        print("%s throughput target (ddp-%s busbw >= %.1f x torch at >= 1 MiB): MET (lowest "
              "ratio %.2f)" % (name, side, bandwidth_factor, min(ratios.values())))


def main():
    args = parse_args()
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks share the cores; every side also sets 1 thread
    commands = side_commands(args, env)
    sides = list(commands)

    print("# allreduce benchmark: %s, %d ranks, float32; PyTorch %s (%s)"
          % (" vs ".join({"mpi": "ddp-MPI", "gloo": "ddp-Gloo", "torch": "torch-Gloo"}[s]
                         for s in sides), WORLD_SIZE,
             bench_common.torch_version(args.python) or "?", args.python))
    for side in sides:
        command, side_env = commands[side]
        prefix = "DDP_BACKEND=mpi " if side_env.get("DDP_BACKEND") == "mpi" else ""
        print("# %-5s: OMP_NUM_THREADS=1 %s%s" % (side, prefix, shlex.join(command)))
    load_before = bench_common.load_average()
    print("# %d rounds, order rotating each round; cores: %d, load average at start: %.2f"
          % (args.rounds, os.cpu_count() or 0, load_before), flush=True)

    # medians[side][bytes] = [median seconds of each round]
    medians = {side: {} for side in sides}
    for round_index in range(args.rounds):
        shift = round_index % len(sides)
        order = sides[shift:] + sides[:shift]
        for side in order:
            command, side_env = commands[side]
            for nbytes, fields in run_side(side, command, side_env).items():
                medians[side].setdefault(nbytes, []).append(float(fields["median_us"]) * 1e-6)
        print("# round %d/%d done (order: %s)" % (round_index + 1, args.rounds, ", ".join(order)),
              flush=True)
    load_after = bench_common.load_average()

    sizes = sorted(set.intersection(*(set(medians[side]) for side in sides)))
    best = {side: {n: min(medians[side][n]) for n in sizes} for side in sides}
    ours = [s for s in sides if s != "torch"]
    header = (["size"] + ["%s us" % s for s in sides] + ["lat %s/torch" % s for s in ours]
              + ["%s GB/s" % s for s in sides] + ["bw %s/torch" % s for s in ours])
    rows = []
    for nbytes in sizes:
        row = [size_name(nbytes)]
        row += ["%.1f" % (best[s][nbytes] * 1e6) for s in sides]
        row += ["%.3f" % (best[s][nbytes] / best["torch"][nbytes]) for s in ours]
        row += ["%.3f" % busbw_gbps(nbytes, best[s][nbytes]) for s in sides]
        row += ["%.2f" % (best["torch"][nbytes] / best[s][nbytes]) for s in ours]
        rows.append(tuple(row))
    print()
    bench_common.print_table(header, rows)

    print()
    print("Per-round medians (us), to show the spread; the table takes the lowest:")
    for nbytes in sizes:
        print("  %-7s %s" % (size_name(nbytes), "   ".join(
            "%s %s" % (s, " ".join("%.1f" % (t * 1e6) for t in medians[s][nbytes])) for s in sides)))

    print()
    for side in ours:
        print_verdicts(side, best, sizes)

    # The load at the end counts this benchmark's own ranks; the one at the
    # start, taken before any rank ran, is the machine's other work.
    print("Load average: %.2f before the first run, %.2f after the last, on %d cores." % (
        load_before, load_after, os.cpu_count() or 0))
    bench_common.warn_if_busy(load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
