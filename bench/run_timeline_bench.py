"""What the timeline costs: the DDP step of bench/ddp_step_bench with the
timeline off and on (ddprun --trace DIR, the last 20 steps kept, the
ranks' files merged at the end), alternating launch by launch in one run
(docs/benchmarks.md, "Timeline").

Usage (any python3; it builds nothing):
  python3 bench/run_timeline_bench.py [BUILD_DIR] [--rounds R] [--models toy,mlp]
      [--iters-toy N] [--iters-mlp N]
BUILD_DIR (default: build) must hold ddprun and bench/ddp_step_bench.

Each round launches both states of each model, the order swapped every
round; a state's figure is the lowest of its per-round medians (other
processes only ever add time), and the ratio is on over off. Prints one line
per launch, then per model
  timeline_bench model=toy off_ms=0.512 on_ms=0.515 ratio=1.006
"""
import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

LINE = r"^ddp_step_bench (impl=ddp .*)$"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build_dir", nargs="?", default="build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="toy,mlp")
    parser.add_argument("--iters-toy", type=int, default=500)
    parser.add_argument("--iters-mlp", type=int, default=20)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1 (got %d)" % args.rounds)
    ddprun, bench = bench_common.built_programs("run_timeline_bench", args.build_dir, ["bench/ddp_step_bench"])
    models = [m for m in args.models.split(",") if m]
    for model in models:
        if model not in ("toy", "mlp"):
            parser.error("--models takes toy and mlp (got %r)" % model)
    iters = {"toy": args.iters_toy, "mlp": args.iters_mlp}
    warmup = {"toy": 50, "mlp": 3}
    best = {}
    with tempfile.TemporaryDirectory(prefix="timeline_bench.") as trace_dir:
        for round_index in range(args.rounds):
            for model in models:
                states = ["off", "on"] if round_index % 2 == 0 else ["on", "off"]
                for state in states:
                    command = bench_common.launch(ddprun, 2)
                    if state == "on":
                        command += ["--trace", trace_dir]
                    command += [bench, "--model", model, "--iters", str(iters[model]),
                                "--warmup", str(warmup[model])]
                    env = dict(os.environ)
                    env.pop("DDP_TRACE_DIR", None)
                    results = bench_common.run_side("run_timeline_bench", "%s-%s" % (model, state), command,
                                                    env, LINE)
                    median = float(results[-1]["median_ms"])
                    print("timeline_bench round=%d model=%s timeline=%s median_ms=%.3f"
                          % (round_index + 1, model, state, median), flush=True)
                    key = (model, state)
                    best[key] = min(best.get(key, median), median)
        if not os.path.exists(os.path.join(trace_dir, "trace.json")):
            sys.stderr.write("run_timeline_bench: the timeline was not written: the 'on' launches did not trace\n")
            sys.exit(1)
    for model in models:
        off, on = best[(model, "off")], best[(model, "on")]
        print("timeline_bench model=%s off_ms=%.3f on_ms=%.3f ratio=%.3f" % (model, off, on, on / off))


main()
