"""The H100 predictions' arithmetic (bench/scaling/predict_gpus.py; docs/scaling.md,
"Predictions for 8 to 1024 H100s"): each term against its formula, and the
published figure the model is compared with between its two bounds.

Usage: predict_gpus_test.py <bench/scaling directory>. Prints
"predict_gpus_test: N of N checks passed" at the end."""

import math
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import predict_gpus as pg  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks("predict_gpus_test")


args = SimpleNamespace(nvlink_gbs=460, node_gbs=400, ib_latency_us=5.0, nvlink_latency_us=2.0, mfu=0.356)
n = 8.03e9

# A ring allgather within one node: 7 steps of 2 us and the bytes over 460 GB/s.
sent = 7 / 8 * 2 * n
got = pg.comm_seconds([("allgather", sent, 2 * n, list(range(8)))], args)
check("allgather-within-a-node", math.isclose(got, 7 * 2e-6 + sent / 460e9), got)

# Across 16 nodes: 127 steps of 5 us and the bytes over the nodes' 400 GB/s.
sent = 127 / 128 * 2 * n
got = pg.comm_seconds([("allgather", sent, 2 * n, list(range(128)))], args)
check("allgather-across-nodes", math.isclose(got, 127 * 5e-6 + sent / 400e9), got)

# An allreduce across 1024 GPUs takes a tree's 2 log2 W steps of latency, not the ring's 2 (W - 1).
sent = 2 * 1023 / 1024 * 4e8
got = pg.comm_seconds([("allreduce", sent, 4e8, list(range(1024)))], args)
check("allreduce-tree-latency", math.isclose(got, 20 * 5e-6 + sent / 400e9), got)

# FSDP's bytes a step: two bf16 gathers and an fp32 reduce-scatter, (W - 1) / W each.
calls = pg.collectives("fsdp", n, 128, 32)
check("fsdp-calls", len(calls) == 96, len(calls))
check("fsdp-bytes", math.isclose(sum(c[1] for c in calls), 8 * n * 127 / 128), sum(c[1] for c in calls))

# Memory: DDP holds 16 bytes a parameter; FSDP's falls with the world.
model = pg.MODELS["llama3.1-8b"]
check("ddp-does-not-fit", pg.memory_gb("ddp", model, 8) > pg.GPU_GB)
check("fsdp-memory-falls", pg.memory_gb("fsdp", model, 1024) < pg.memory_gb("fsdp", model, 8) < pg.GPU_GB)

# The MFU default reproduces torchtitan's 8-GPU row when communication is hidden (within 1%).
tokens = model[4] * model[5]
check("mfu-calibration", abs(tokens / pg.compute_seconds(model, 0.356) / 5762 - 1) < 0.01)

# torchtitan's 128-GPU figure lies between the no-overlap and overlapped predictions.
compute = pg.compute_seconds(model, args.mfu)
comm = pg.comm_seconds(pg.collectives("fsdp", n, 128, 32), args)
low, high = tokens / (compute + comm), tokens / max(compute, comm)
check("published-128-between-bounds", low <= 5605 <= high, (low, high))

check.finish()
