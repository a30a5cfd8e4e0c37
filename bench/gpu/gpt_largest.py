"""The largest GPT (examples/gpt) that one GPU trains, in three modes, and
its speed against PyTorch 2.11 on the same configuration.

Usage (on a machine with one GPU; ddp built with -DDDP_WITH_NCCL=ON):
  python3 bench/gpu/gpt_largest.py BUILD_DIR [--python python3] [--budget-s 900]
      [--embd 2048] [--heads 16] [--block 256] [--batch 8] [--modes ddp,fsdp-ac,offload]

Modes, at world size 1 (so nothing is communicated: each row compares the
per-step work and memory of each wrapper):
  ddp       DistributedDataParallel, the whole model and AdamW's state on the GPU
            (PyTorch: DistributedDataParallel, built on the GPU)
  fsdp-ac   FullyShardedDataParallel, every block a unit and checkpointed,
            built unit by unit (--meta-init) (PyTorch: FSDP2's fully_shard,
            checkpoint_wrapper, the meta device)
  offload   the same with CPU offload: shards, gradients and AdamW's state in
            pinned host memory, the step on the host (PyTorch: CPUOffloadPolicy)

How the largest is found, within --budget-s: for each mode and side, two
short runs (4 and 12 layers) give the memory that binds (the GPU's for ddp
and fsdp-ac, the host's for offload) as a + b * layers; that predicts the
largest layer count L under the device's memory less a margin. Then ddp runs
0.96 L for a few steps (it should train), 1.04 L + 1 for two (it should run
out of memory: the pair brackets the largest), and PyTorch runs ddp's size,
for tokens/s on the same configuration (and, if PyTorch runs out of memory
there, both run PyTorch's predicted size). Offload's bound is the host's
memory, whose runs would take minutes a step: its probes give its speed
and its projected largest (--offload-layers N runs both sides at N). A run that the budget cannot hold is
printed as skipped. GPU memory is the device's use as NVML samples it every
50 ms, less its use before the run (the CUDA context and the caching
allocator's reserve included, the same for both sides).

Prints one "run ..." line per run and a summary; exits 0 whatever the sizes.
"""

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROBES = (4, 12)


class GpuSampler:
    """The GPU's used memory, sampled every 50 ms while a run lasts (MiB)."""

    def __init__(self):
        self.handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # no NVML: memory is not reported
            print(f"gpt_largest: no NVML ({e}); GPU memory is not sampled", flush=True)

    def used_mib(self):
        if self.handle is None:
            return 0.0
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20

    def total_mib(self):
        if self.handle is None:
            return 0.0
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).total / 2**20

    def __enter__(self):
        self.base = self.used_mib()
        self.peak = self.base
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def _loop(self):
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, self.used_mib())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.used_mib())


def host_total_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def params_of(layers, embd, block):
    # Token and position embeddings (the head shares the token embedding's
    # weight), 12 d^2 + 13 d per block, the final LayerNorm.
    return 256 * embd + block * embd + layers * (12 * embd * embd + 13 * embd) + 2 * embd


class Bench:
    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.budget_s
        self.gpu = GpuSampler()
        self.rows = []

    def left(self):
        return self.deadline - time.monotonic()

    def command(self, impl, mode, layers, steps):
        a = self.args
        size = ["--layers", str(layers), "--embd", str(a.embd), "--heads", str(a.heads), "--block", str(a.block),
                "--batch", str(a.batch), "--steps", str(steps), "--log-every", "1", "--threads", str(a.threads),
                "--report"]
        parallel = ["--parallel", "ddp"] if mode == "ddp" else ["--parallel", "fsdp", "--activation-checkpointing",
                                                                "--meta-init"]
        if mode == "offload":
            parallel.append("--cpu-offload")
        if impl == "ddp":
            return [os.path.join(a.build, "ddprun"), "--nproc-per-node", "1", "--no-prefix",
                    os.path.join(a.build, "examples", "gpt_train"), "--sample", "0"] + parallel + size
        return [a.python, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                os.path.join(ROOT, "examples", "gpt", "gpt.py"), "--device", "cuda"] + parallel + size

    def run(self, impl, mode, layers, steps, why, cap_s=150.0):
        timeout = min(cap_s, self.left())
        row = {"impl": impl, "mode": mode, "layers": layers, "why": why,
               "params": params_of(layers, self.args.embd, self.args.block)}
        if timeout < 15:
            row["result"] = "skipped (time)"
            self.report(row)
            return row
        cmd = self.command(impl, mode, layers, steps)
        start = time.monotonic()
        with self.gpu as sampled:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True, cwd=ROOT)
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                row["result"] = f"timeout ({timeout:.0f} s)"
        row["seconds"] = time.monotonic() - start
        row["gpu_mib"] = sampled.peak - sampled.base
        m = re.search(r"^gpt_result (.*)$", out, re.M)
        if m:
            fields = dict(kv.split("=", 1) for kv in m.group(1).split())
            row["tokens_per_s"] = float(fields["tokens_per_s"])
            row["rss_mb"] = float(fields["peak_rss_mb"])
        if "result" not in row:
            if proc.returncode == 0 and m:
                row["result"] = "trained"
            elif re.search(r"out of memory|OutOfMemory|CUDA error: out of memory|cannot allocate|bad_alloc", out,
                           re.I):
                row["result"] = "out of memory"
            else:
                row["result"] = f"failed (exit {proc.returncode})"
        if row["result"] != "trained":
            lines = [line for line in out.splitlines() if line.strip()]
            errors = [line for line in lines if re.search(r"^\S*(Error|Exception)\b|out of memory|what\(\)", line)
                      and "ChildFailedError" not in line]
            row["tail"] = " | ".join(t[:300] for t in (errors[-2:] or lines[-3:]))
        self.report(row)
        return row

    def report(self, row):
        self.rows.append(row)
        keys = ["impl", "mode", "layers", "params", "result", "tokens_per_s", "gpu_mib", "rss_mb", "seconds", "why",
                "tail"]
        parts = []
        for k in keys:
            if k in row:
                v = row[k]
                if k == "params":
                    v = f"{v / 1e9:.3f}B"
                elif isinstance(v, float):
                    v = f"{v:.1f}"
                elif isinstance(v, str) and " " in v:
                    v = f'"{v}"'
                parts.append(f"{k}={v}")
        print("run " + " ".join(parts), flush=True)

    def predict(self, mode, probes):
        """The largest layer count under the binding memory, from two probes."""
        (l1, r1), (l2, r2) = probes
        key = "rss_mb" if mode == "offload" else "gpu_mib"
        if any(r.get("result") != "trained" for r in (r1, r2)):
            return None, "a probe did not train"
        m1, m2 = r1.get(key, 0.0), r2.get(key, 0.0)
        slope = (m2 - m1) / (l2 - l1)
        if mode == "offload":
            limit = host_total_mb() - self.args.host_margin_mb
            what = f"host {limit:.0f} MB"
        else:
            limit = self.gpu.total_mib() - self.gpu.base - self.args.gpu_margin_mib
            what = f"GPU {limit:.0f} MiB"
        if slope <= 0:
            return None, f"{key} did not grow with layers ({m1:.0f}, {m2:.0f})"
        largest = l2 + math.floor((limit - m2) / slope)
        return largest, f"{key} = {m1 - slope * l1:.0f} + {slope:.1f} per layer; {what} -> {largest} layers"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build")
    p.add_argument("--python", default="python3")
    p.add_argument("--budget-s", type=float, default=900)
    p.add_argument("--embd", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="steps of the runs at the largest size")
    p.add_argument("--threads", type=int, default=16, help="intra-op threads (AdamW's host step under offload)")
    p.add_argument("--modes", default="ddp,fsdp-ac,offload")
    p.add_argument("--gpu-margin-mib", type=float, default=2048)
    p.add_argument("--host-margin-mb", type=float, default=12288)
    p.add_argument("--offload-layers", type=int, default=0,
                   help="offload: run both sides at this size instead of the host-bound largest (0: the largest)")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    bench = Bench(args)
    modes = args.modes.split(",")
    print(f"gpt_largest: GPT {args.embd} wide, {args.heads} heads, block {args.block}, batch {args.batch}; "
          f"GPU {bench.gpu.total_mib():.0f} MiB, host {host_total_mb():.0f} MB; budget {args.budget_s:.0f} s",
          flush=True)

    # Largest first for the GPU-bound modes (probes, then both sides at
    # ddp's size); offload's bound is the host's, too slow to reach in a few
    # minutes, so its probes give its speed and its projected largest.
    predictions, summary = {}, []
    for mode in modes:
        probes = {}
        for impl in ("ddp", "torch"):
            probes[impl] = [(n, bench.run(impl, mode, n, 2, "probe", cap_s=90)) for n in PROBES]
            largest, how = bench.predict(mode, probes[impl])
            predictions[(impl, mode)] = largest
            print(f"predict impl={impl} mode={mode} largest={largest} "
                  f"({params_of(largest or 0, args.embd, args.block) / 1e9:.2f}B; {how})", flush=True)
        largest = predictions[("ddp", mode)]
        if mode == "offload" and not args.offload_layers:
            summary.append((mode, PROBES[1], probes["ddp"][1][1], probes["torch"][1][1]))
            continue
        if largest is None:
            continue
        size = args.offload_layers if mode == "offload" else max(PROBES[1], math.floor(0.96 * largest))
        ours = bench.run("ddp", mode, size, args.steps, "0.96 x predicted", cap_s=200)
        theirs = bench.run("torch", mode, size, args.steps, "ddp's size", cap_s=200)
        summary.append((mode, size, ours, theirs))
        their_largest = predictions[("torch", mode)]
        if theirs.get("result") == "out of memory" and their_largest and 0.96 * their_largest < size:
            # PyTorch does not fit ddp's size: both at PyTorch's, for a speed on the same model.
            size = max(PROBES[1], math.floor(0.96 * their_largest))
            theirs = bench.run("torch", mode, size, args.steps, "0.96 x PyTorch's predicted", cap_s=200)
            ours = bench.run("ddp", mode, size, args.steps, "PyTorch's size", cap_s=200)
            summary.append((mode, size, ours, theirs))
        if mode != "offload":  # offload's bound is the host's: not run out of on purpose
            # Two steps: AdamW's state is made in the first step's optimizer
            # step, after backward has freed the activations, so only the
            # second step reaches the training peak.
            bench.run("ddp", mode, math.ceil(1.04 * largest) + 1, 2, "1.04 x predicted + 1", cap_s=180)

    print("\nsummary (tokens/s over the steps after the first; GPU MiB: the device's use over its use before)")
    print("| mode | layers | parameters | ddp | PyTorch | ddp / PyTorch | ddp GPU MiB | PyTorch GPU MiB | ddp RSS MB |"
          " PyTorch RSS MB |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for mode, size, ours, theirs in summary:
        def speed(r):
            return f"{r['tokens_per_s']:.0f}" if r.get("result") == "trained" else r.get("result", "?")
        ratio = (f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}"
                 if ours.get("result") == theirs.get("result") == "trained" else "")
        print(f"| {mode} | {size} | {ours['params'] / 1e9:.2f}B | {speed(ours)} | {speed(theirs)} | {ratio} | "
              f"{ours.get('gpu_mib', 0):.0f} | {theirs.get('gpu_mib', 0):.0f} | {ours.get('rss_mb', 0):.0f} | "
              f"{theirs.get('rss_mb', 0):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
