"""Runs gpt_train (examples/gpt) and its PyTorch twin (examples/gpt/gpt.py,
FSDP2 and checkpoint_wrapper) side by side on the same GPT, batch and
sequence, and prints the figures and the ratios.

Usage (any python3; it builds nothing):
  python3 bench/run_gpt_bench.py [BUILD_DIR] [--layers 12] [--embd 768] [--heads 12]
      [--block 512] [--batch 2] [--steps 4] [--no-largest] [--modes ddp,fsdp,fsdp-ac] [--python PATH]
BUILD_DIR (default: build) must hold ddprun and examples/gpt_train; --python
is PyTorch's side (default: the torch 2.11 venv of scripts/compat.sh).

Both sides: 2 ranks (Gloo, one thread each), the byte-level GPT of
examples/gpt (12 layers, 768 wide by default: 85M parameters), AdamW. For
each of DDP, FSDP (kFullShard; FSDP2) and FSDP with activation checkpointing
on every block:
  tokens/s     over the steps after the first (both ranks' tokens);
  step MB      the largest rise of a rank's resident set over one step
               after the first: the activations, and the gradients' own
               buffers where a step allocates them again;
  peak MB      a rank's peak resident set over the run, and over its
               resident set after `import torch` / LibTorch's start (base);
               for ddp less the pages of the peer's shared buffers that the
               rank maps (its buckets and shards on one host lie in shared
               memory, Note [Shared buffers]: the peer's resident set counts
               those pages too, so the raw figure counts them twice; gpt_train
               --report gives them as peer_shared_mb, printed apart);
and for FSDP, eager against deferred construction (ddp: --meta-init,
deferred units; PyTorch: the meta device and to_empty after fully_shard):
the peak resident set during construction over the base. Then, unless
--no-largest, the largest GPT by layers that trains in 20 GiB on the 2 ranks,
estimated for each side and mode from the per-layer rise of the peak
between two short runs (4 and 8 layers): an extrapolation, not a run at
that size. Both sides run with MALLOC_MMAP_THRESHOLD_=65536 (see below).
--rounds N runs DDP, FSDP and FSDP with activation checkpointing N times,
the two sides alternating, and gives each figure's median (default 3).
Exits 0 whatever the figures, 1 if a side fails.
"""

import argparse
import os
import sys

import bench_common

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DRIVER = "run_gpt_bench.py"
LINE = r"^gpt_result (impl=.*)$"
WORLD_SIZE = 2
BUDGET_MB = 20 * 1024  # the 2 ranks together


def main():
    parser = argparse.ArgumentParser(description="GPT training: ddp against PyTorch 2.11 FSDP2 + checkpoint_wrapper.")
    bench_common.add_common_arguments(parser, ["examples/gpt_train"],
                                      "runs of each training mode and side, alternating; medians (default 3)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank and step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-largest", action="store_true", help="leave out the largest-model estimate")
    parser.add_argument("--modes", default="ddp,fsdp,fsdp-ac",
                        help="training modes to run, of ddp, fsdp, fsdp-ac (default: all three); the activation "
                             "memory line and the construction rows need fsdp and fsdp-ac")
    parser.set_defaults(rounds=3)
    args = parser.parse_args()
    ddprun, train = bench_common.built_programs(DRIVER, args.build_dir, ["examples/gpt_train"])
    python = args.python or bench_common.default_python()
    gpt_py = os.path.join(ROOT, "examples", "gpt", "gpt.py")
    load_before = bench_common.load_average()
    # Both sides with glibc's mmap threshold fixed at 64 KiB: a freed block
    # of that size or more goes back to the system, so the resident set
    # follows what is allocated (by default glibc raises the threshold and
    # keeps large freed blocks, and a step's rise in the resident set would
    # not show its activations). It costs neither side speed here.
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    print("# gpt bench: %d ranks, %d layers, %d wide, %d heads, block %d, batch %d per rank, %d steps; PyTorch %s (%s)"
          % (WORLD_SIZE, args.layers, args.embd, args.heads, args.block, args.batch, args.steps,
             bench_common.torch_version(python), python))

    def run(side, flags, layers=None, steps=None):
        model = ["--layers", str(layers or args.layers), "--embd", str(args.embd), "--heads", str(args.heads),
                 "--block", str(args.block), "--batch", str(args.batch),
                 "--steps", str(args.steps if steps is None else steps), "--report"]
        if side == "ddp":
            command = bench_common.launch(ddprun, WORLD_SIZE) + [train, "--sample", "0", "--log-every", "1000"]
        else:
            command = bench_common.launch(ddprun, WORLD_SIZE) + [python, gpt_py, "--log-every", "1000"]
        results = bench_common.run_side(DRIVER, side, command + model + flags, env, LINE)
        for r in results:  # what the rank alone holds (the docstring says why)
            r["peak_rss_mb"] = float(r["peak_rss_mb"]) - float(r.get("peer_shared_mb", 0))
        return {key: max(float(r.get(key, 0)) for r in results)
                for key in ("tokens_per_s", "step_extra_mb", "construction_extra_mb", "peak_rss_mb", "base_mb",
                            "peer_shared_mb")}

    def median(values):
        values = sorted(values)
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    all_modes = {"ddp": ("DDP", ["--parallel", "ddp"]), "fsdp": ("FSDP", ["--parallel", "fsdp"]),
                 "fsdp-ac": ("FSDP + activation checkpointing",
                             ["--parallel", "fsdp", "--activation-checkpointing"])}
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in all_modes]
    if unknown or not chosen:
        parser.error("--modes: expected some of ddp, fsdp, fsdp-ac, got %r" % args.modes)
    modes = [all_modes[m] for m in all_modes if m in chosen]
    both_fsdp = "fsdp" in chosen and "fsdp-ac" in chosen
    runs = {}
    for round_index in range(args.rounds):
        for label, flags in modes:
            for side in ("ddp", "torch"):
                runs.setdefault((label, side), []).append(run(side, flags))
    figures = {where: {key: median([r[key] for r in rs]) for key in rs[0]} for where, rs in runs.items()}
    for label, _ in modes:
        print("# %s tokens/s per round: ddp %s, PyTorch %s; ddp's resident set also held %.0f MB of the peer's "
              "shared buffers (not counted below)"
              % (label, " ".join("%.0f" % r["tokens_per_s"] for r in runs[(label, "ddp")]),
                 " ".join("%.0f" % r["tokens_per_s"] for r in runs[(label, "torch")]),
                 figures[(label, "ddp")]["peer_shared_mb"]))

    def ratio(ours, theirs):
        return "%.2f" % (ours / theirs) if theirs > 0 else "n/a"

    rows = []
    for label, _ in modes:
        ours, theirs = figures[(label, "ddp")], figures[(label, "torch")]
        rows.append([label + ": tokens/s", "%.0f" % ours["tokens_per_s"], "%.0f" % theirs["tokens_per_s"],
                     ratio(ours["tokens_per_s"], theirs["tokens_per_s"])])
        rows.append([label + ": step MB per rank", "%.0f" % ours["step_extra_mb"], "%.0f" % theirs["step_extra_mb"],
                     ratio(ours["step_extra_mb"], theirs["step_extra_mb"])])
        ours_peak, theirs_peak = ours["peak_rss_mb"] - ours["base_mb"], theirs["peak_rss_mb"] - theirs["base_mb"]
        rows.append([label + ": peak MB per rank over base", "%.0f" % ours_peak, "%.0f" % theirs_peak,
                     ratio(ours_peak, theirs_peak)])
        rows.append([label + ": peak MB per rank", "%.0f" % ours["peak_rss_mb"], "%.0f" % theirs["peak_rss_mb"],
                     ratio(ours["peak_rss_mb"], theirs["peak_rss_mb"])])
    for side in ("ddp", "torch") if both_fsdp else ():
        plain = figures[("FSDP", side)]["step_extra_mb"]
        checkpointed = figures[("FSDP + activation checkpointing", side)]["step_extra_mb"]
        print("# %s: activation checkpointing cuts a step's memory %.1fx (%.0f MB -> %.0f MB)"
              % (side, plain / max(checkpointed, 1.0), plain, checkpointed))

    # Construction: eager against deferred, construction only.
    construction = [("FSDP construction, eager: peak MB over base", ["--parallel", "fsdp"]),
                    ("FSDP construction, deferred (meta): peak MB over base", ["--parallel", "fsdp", "--meta-init"])]
    for label, flags in construction if "fsdp" in chosen else ():
        ours, theirs = run("ddp", flags, steps=0), run("torch", flags, steps=0)
        rows.append([label, "%.0f" % ours["construction_extra_mb"], "%.0f" % theirs["construction_extra_mb"],
                     ratio(ours["construction_extra_mb"], theirs["construction_extra_mb"])])

    if not args.no_largest:
        for label, flags in modes:
            estimates = []
            for side in ("ddp", "torch"):
                small, large = (run(side, flags, layers=n, steps=2) for n in (4, 8))
                per_layer = (large["peak_rss_mb"] - small["peak_rss_mb"]) / 4.0
                fixed = small["peak_rss_mb"] - 4 * per_layer
                layers = int((BUDGET_MB / WORLD_SIZE - fixed) / per_layer) if per_layer > 0 else 0
                estimates.append((layers, per_layer))
            rows.append([label + ": largest in 20 GiB, layers (estimated)", "%d" % estimates[0][0],
                         "%d" % estimates[1][0], ratio(estimates[0][0], estimates[1][0])])
            rows.append([label + ": peak MB per layer per rank", "%.0f" % estimates[0][1], "%.0f" % estimates[1][1],
                         ratio(estimates[0][1], estimates[1][1])])
    bench_common.print_table(["figure", "ddp", "PyTorch", "ddp / PyTorch"], rows)
    print("params=%d" % int(run_params(args)))
    bench_common.warn_if_busy(load_before)
    return 0


def run_params(args):
    c = args.embd
    return args.layers * (12 * c * c + 13 * c) + (256 + args.block) * c + 2 * c + c * 256


if __name__ == "__main__":
    sys.exit(main())
