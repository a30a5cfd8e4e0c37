"""Runs the allreduce benchmark of ddp and of torch.distributed side by side.

Usage (run with Debian's interpreter, which has torch; it builds nothing):
  /usr/bin/python3 bench/run_allreduce_bench.py [BUILD_DIR] [--rounds R]
      [--sizes 4K,1M,...] [--iters N] [--warmup N] [--python PATH]
BUILD_DIR (default: build) must hold ddprun and bench/allreduce_bench, as
built by `ninja -C BUILD_DIR ddprun allreduce_bench`.

It launches both halves with our own ddprun, 2 ranks each, so that they start
the same way: BUILD_DIR/bench/allreduce_bench (ddp) and
bench/allreduce_bench.py under /usr/bin/python3 (torch.distributed, Gloo).
Both sweep 4 KiB to 64 MiB of float32 with the same methodology (see the top
of allreduce_bench.cpp).

Noise: the two halves alternate as whole sweeps, R rounds (default 2), the
order flipping each round (ddp then torch, torch then ddp, ...), so that
neither always runs first or last. For each size and side, the reported
latency is the lowest of its per-round medians: other processes only ever add
time, so the best round is the one least disturbed. The per-round medians are
printed too, to show the spread.

Prints one table (size, latency of each side and their ratio, bus bandwidth of
each side and their ratio) and a verdict for each target of the issue:
  throughput: ddp's bus bandwidth >= torch's at every size of 1 MiB and above;
  latency:    ddp's latency <= torch's at 4 KiB.
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

LINE = r"^allreduce_bench (impl=.*)$"


def parse_args():
    parser = argparse.ArgumentParser(
        description="Allreduce latency and bus bandwidth: ddp against torch.distributed (Gloo).")
    bench_common.add_common_arguments(parser, ["bench/allreduce_bench"],
                                      "sweeps of each side, alternating (default: 2)")
    parser.add_argument("--sizes", help="passed to both halves, e.g. 4K,1M (default: theirs)")
    parser.add_argument("--iters", help="passed to both halves (default: from the size)")
    parser.add_argument("--warmup", help="passed to both halves (default: from --iters)")
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    return args


def half_commands(args):
    """The two launch commands, keyed by side."""
    ddprun, bench = bench_common.built_programs("run_allreduce_bench.py", args.build_dir,
                                                ["bench/allreduce_bench"])
    extra = []
    for flag in ("sizes", "iters", "warmup"):
        value = getattr(args, flag)
        if value is not None:
            extra += ["--" + flag, value]
    launch = bench_common.launch(ddprun, WORLD_SIZE)
    return {
        "ddp": launch + [bench] + extra,
        "torch": launch + [args.python, os.path.join(HERE, "allreduce_bench.py")] + extra,
    }


def run_half(side, command, env):
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


def main():
    args = parse_args()
    commands = half_commands(args)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks share the cores; both halves also set 1 thread

    print("# allreduce benchmark: ddp vs torch.distributed, Gloo, %d ranks, float32" % WORLD_SIZE)
    for side in ("ddp", "torch"):
        print("# %-5s: OMP_NUM_THREADS=1 %s" % (side, shlex.join(commands[side])))
    load_before = bench_common.load_average()
    print("# %d rounds, order flipping each round; cores: %d, load average at start: %.2f"
          % (args.rounds, os.cpu_count() or 0, load_before), flush=True)

    # medians[side][bytes] = [median seconds of each round]
    medians = {"ddp": {}, "torch": {}}
    for round_index in range(args.rounds):
        order = ("ddp", "torch") if round_index % 2 == 0 else ("torch", "ddp")
        for side in order:
            for nbytes, fields in run_half(side, commands[side], env).items():
                medians[side].setdefault(nbytes, []).append(float(fields["median_us"]) * 1e-6)
        print("# round %d/%d done (%s first)" % (round_index + 1, args.rounds, order[0]),
              flush=True)
    load_after = bench_common.load_average()

    sizes = sorted(set(medians["ddp"]) & set(medians["torch"]))
    header = ("size", "ddp us", "torch us", "lat ddp/torch",
              "ddp GB/s", "torch GB/s", "bw ddp/torch")
    rows = []
    best = {}
    for nbytes in sizes:
        ours, theirs = min(medians["ddp"][nbytes]), min(medians["torch"][nbytes])
        best[nbytes] = (ours, theirs)
        ours_bw, theirs_bw = busbw_gbps(nbytes, ours), busbw_gbps(nbytes, theirs)
        rows.append((size_name(nbytes), "%.1f" % (ours * 1e6), "%.1f" % (theirs * 1e6),
                     "%.2f" % (ours / theirs), "%.3f" % ours_bw, "%.3f" % theirs_bw,
                     "%.2f" % (ours_bw / theirs_bw)))
    print()
    bench_common.print_table(header, rows)

    print()
    print("Per-round medians (us), to show the spread; the table takes the lowest:")
    for nbytes in sizes:
        print("  %-7s ddp %-40s torch %s" % (
            size_name(nbytes),
            " ".join("%.1f" % (s * 1e6) for s in medians["ddp"][nbytes]),
            " ".join("%.1f" % (s * 1e6) for s in medians["torch"][nbytes])))

    print()
    big = [n for n in sizes if n >= THROUGHPUT_TARGET_MIN_BYTES]
    if big:
        missed = [n for n in big if best[n][0] > best[n][1]]
        if missed:
            print("Throughput target (ddp busbw >= torch at >= 1 MiB): MISSED at %s (ratio %s)"
                  % (", ".join(size_name(n) for n in missed),
                     ", ".join("%.2f" % (best[n][1] / best[n][0]) for n in missed)))
        else:
            print("Throughput target (ddp busbw >= torch at >= 1 MiB): MET (lowest ratio %.2f)"
                  % min(best[n][1] / best[n][0] for n in big))
    else:
        print("Throughput target (ddp busbw >= torch at >= 1 MiB): not measured (no such size)")
    if LATENCY_TARGET_BYTES in best:
        ours, theirs = best[LATENCY_TARGET_BYTES]
        print("Latency target (ddp latency <= torch at 4 KiB): %s (%.1f us vs %.1f us, ratio %.2f)"
              % ("MET" if ours <= theirs else "MISSED", ours * 1e6, theirs * 1e6, ours / theirs))
    else:
        print("Latency target (ddp latency <= torch at 4 KiB): not measured (4 KiB not in --sizes)")

    # The load at the end counts this benchmark's own ranks; the one at the
    # start, taken before any rank ran, is the machine's other work.
    print("Load average: %.2f before the first run, %.2f after the last, on %d cores." % (
        load_before, load_after, os.cpu_count() or 0))
    bench_common.warn_if_busy(load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
