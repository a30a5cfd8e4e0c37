#!/usr/bin/env python3
"""Predictions for H100 clusters (docs/scaling.md, "Predictions for 8 to 1024 H100s").

The cost model of cost_model.py, given what nobody can measure here: the
step's compute, from the model's FLOPs and a model FLOPs utilisation (MFU),
and NCCL's bandwidths on H100 nodes, from published nccl-tests figures.
For each model, strategy and world size it prints the memory each GPU holds
and the step time with and without overlap of communication and compute,
and, where a published PyTorch figure exists, that figure beside it.

Assumptions (each one a flag):
- Nodes of 8 H100 SXM (80 GB, 989 TFLOP/s dense bf16), NVLink within a
  node, one 400 Gbit/s InfiniBand NIC per GPU across nodes.
- Bandwidths are nccl-tests' bus bandwidths at large sizes, in which the
  time of any ring collective is the bytes a rank sends over the bus
  bandwidth: 460 GB/s within a node (8 x H100 SXM NVLink all_reduce,
  460-480 GB/s) and 400 GB/s for a ring across nodes (H100 SXM with NDR
  InfiniBand, 400-450 GB/s); the low end of each range. Sources in
  docs/scaling.md. The model's "host link" is the node's aggregate (8 NICs):
  in NCCL's rings one hop in eight leaves the node, each ring on its own
  NIC, which is what the cross-node bus bandwidth measures.
- Latency per step: 5 us across nodes, 2 us within one (assumed, not
  measured). Allgathers and reduce-scatters are rings ((W - 1) steps, as
  NCCL runs them with 8 GPUs per node); an allreduce takes the cheaper of
  the ring's 2 (W - 1) steps and a tree's 2 log2 W, as NCCL's tuner does.
  FSDP and HSDP issue their collectives per unit (a layer), DDP per 25 MiB
  bucket.
- Mixed precision as PyTorch's FSDP2 recipes (torchtitan): bf16 compute,
  fp32 parameters, gradients reduced in fp32, AdamW (two fp32 moments):
  16 bytes of state per parameter. FSDP gathers bf16 parameters, twice per
  step under activation checkpointing (forward and backward), and
  reduce-scatters fp32 gradients; DDP allreduces fp32 gradients; ZeRO
  (ddp's, as PyTorch's ZeroRedundancyOptimizer: DDP's allreduce, then each
  rank steps its partition and broadcasts it) adds one fp32 broadcast per
  rank (NCCL's pipelined chain); HSDP shards within a
  node and allreduces fp32 shards across.
- Compute: (6 N + 12 L d s) FLOPs per token (N parameters, L layers, width
  d, sequence s; attention without the causal saving), plus 2 N for the
  recomputed forward under full activation checkpointing, at the given MFU
  of 989 TFLOP/s. The default MFU, 0.356, is what torchtitan's Llama 3.1 8B
  FSDP row on 8 GPUs (5,762 tokens/s per GPU, selective checkpointing)
  comes to by that count, taking its communication as hidden.
- Memory per GPU: the state (16 N bytes, sharded as each strategy does),
  two bf16 units gathered at once (FSDP, HSDP), the checkpointed layer
  inputs (2 b s d bytes per layer), one layer's activations in the
  recomputation (34 b s d bytes: Korthikanti et al. 2022, with flash
  attention), and the logits in fp32 (4 b s V).
"""

import argparse
import math

from cost_model import call_seconds

PEAK_FLOPS = 989e12
GPU_GB = 80
PER_NODE = 8

# name: parameters, layers, width, vocabulary, sequence, local batch, activation checkpointing
MODELS = {
    "llama3.1-8b": (8.03e9, 32, 4096, 128256, 8192, 2, "selective"),
    "gpt-7b": (7.05e9, 35, 4096, 256, 8192, 2, "full"),
    "llama3.1-70b": (70.6e9, 80, 8192, 128256, 8192, 1, "full"),
}

# (model, strategy, world): published tokens/s per GPU, and where.
PUBLISHED = {
    ("llama3.1-8b", "fsdp", 8): (5762, "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, Table 1"),
    ("llama3.1-8b", "fsdp", 128): (5605, "torchtitan, same file, Table 3"),
}


def per_unit(calls, count):
    """Each call split into `count` equal ones (FSDP's units, DDP's buckets)."""
    return [(op, sent / count, n / count, members) for op, sent, n, members in calls for _ in range(count)]


def collectives(strategy, n_params, world, layers):
    """[(op, bytes this rank sends, tensor bytes, members)] of one step: FSDP's and HSDP's per
    unit (one per layer), DDP's per 25 MiB bucket, ZeRO's as DDP's and then one broadcast of each
    rank's partition."""
    buckets = max(1, round(4 * n_params / (25 << 20)))
    if strategy == "zero":
        # DDP's buckets, then each rank's partition broadcast from it.
        everyone = list(range(world))
        part = 4 * n_params / world
        return per_unit(whole_model("ddp", n_params, world), buckets) + [
            ("broadcast", part, part, everyone) for _ in range(world)]
    return per_unit(whole_model(strategy, n_params, world), layers if strategy in ("fsdp", "hsdp") else buckets)


def whole_model(strategy, n_params, world):
    everyone = list(range(world))
    frac = (world - 1) / world
    if strategy == "ddp":
        return [("allreduce", 2 * frac * 4 * n_params, 4 * n_params, everyone)]
    if strategy == "zero":
        return [("allreduce", 2 * frac * 4 * n_params, 4 * n_params, everyone),
                ("allgather", frac * 4 * n_params, 4 * n_params, everyone)]
    if strategy == "fsdp":
        return [("allgather", frac * 2 * n_params, 2 * n_params, everyone),
                ("allgather", frac * 2 * n_params, 2 * n_params, everyone),
                ("reduce_scatter", frac * 4 * n_params, 4 * n_params, everyone)]
    if strategy == "hsdp":
        shard = list(range(PER_NODE))  # rank 0's node
        replicas = world // PER_NODE
        local = (PER_NODE - 1) / PER_NODE
        calls = [("allgather", local * 2 * n_params, 2 * n_params, shard),
                 ("allgather", local * 2 * n_params, 2 * n_params, shard),
                 ("reduce_scatter", local * 4 * n_params, 4 * n_params, shard)]
        if replicas > 1:
            across = list(range(0, world, PER_NODE))  # rank 0's replicate group
            shard_bytes = 4 * n_params / PER_NODE
            calls.append(("allreduce", 2 * (replicas - 1) / replicas * shard_bytes, shard_bytes, across))
        return calls
    raise ValueError(strategy)


def comm_seconds(calls, args):
    total = 0.0
    for op, sent, n, members in calls:
        within = max(members) // PER_NODE == min(members) // PER_NODE
        nvlink = sent / args.nvlink_gbs / 1e9
        if within:
            total += (len(members) - 1) * args.nvlink_latency_us * 1e-6 + nvlink
        else:
            # Across nodes: the cost model's ring over the nodes' aggregate
            # link, and never faster than NVLink carries the same bytes.
            latency = args.ib_latency_us * 1e-6
            across = call_seconds(op, sent, n, members, PER_NODE, args.node_gbs * 1e9, latency, backend="nccl")
            if op == "allreduce":
                # NCCL's tuner takes a tree where the ring's 2 (W - 1)
                # steps of latency cost more: 2 log2(W) steps.
                ring_steps = 2 * (len(members) - 1)
                tree_steps = 2 * math.ceil(math.log2(len(members)))
                across -= (ring_steps - min(ring_steps, tree_steps)) * latency
            total += max(across, nvlink)
    return total


def memory_gb(strategy, model, world):
    n_params, layers, d, vocab, seq, batch, ac = model
    unit = 2 * n_params / layers  # one layer in bf16
    shards = {"ddp": 16 * n_params,
              "zero": 8 * n_params + 8 * n_params / world,
              "fsdp": 16 * n_params / world + 2 * unit,
              "hsdp": 16 * n_params / min(world, PER_NODE) + 2 * unit}[strategy]
    activations = layers * 2 * batch * seq * d + 34 * batch * seq * d + 4 * batch * seq * vocab
    return (shards + activations) / 1e9


def compute_seconds(model, mfu):
    n_params, layers, d, vocab, seq, batch, ac = model
    per_token = 6 * n_params + 12 * layers * d * seq + (2 * n_params if ac == "full" else 0)
    return batch * seq * per_token / (PEAK_FLOPS * mfu)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="8,16,64,128,256,1024")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--strategies", default="ddp,zero,fsdp,hsdp")
    parser.add_argument("--mfu", type=float, default=0.356)
    parser.add_argument("--nvlink-gbs", type=float, default=460, help="bus bandwidth within a node, GB/s")
    parser.add_argument("--node-gbs", type=float, default=400, help="bus bandwidth across nodes, GB/s")
    parser.add_argument("--ib-latency-us", type=float, default=5.0)
    parser.add_argument("--nvlink-latency-us", type=float, default=2.0)
    args = parser.parse_args()
    print("| model | strategy | GPUs | memory GB/GPU | compute s | comm s | step s (no overlap / overlapped) "
          "| tokens/s/GPU (no overlap / overlapped) | published |")
    print("|---|---|---:|---:|---:|---:|---|---|---|")
    for name in args.models.split(","):
        model = MODELS[name]
        tokens = model[4] * model[5]
        compute = compute_seconds(model, args.mfu)
        for strategy in args.strategies.split(","):
            for world in (int(w) for w in args.worlds.split(",")):
                memory = memory_gb(strategy, model, world)
                if memory > GPU_GB:
                    print(f"| {name} | {strategy} | {world} | {memory:.0f} (does not fit) | | | | | |")
                    continue
                comm = comm_seconds(collectives(strategy, model[0], world, model[1]), args)
                serial, overlapped = compute + comm, max(compute, comm)
                published = PUBLISHED.get((name, strategy, world))
                shown = f"{published[0]:,} ({published[1]})" if published else ""
                print(f"| {name} | {strategy} | {world} | {memory:.0f} | {compute:.3f} | {comm:.3f} "
                      f"| {serial:.3f} / {overlapped:.3f} | {tokens / serial:,.0f} / {tokens / overlapped:,.0f} "
                      f"| {shown} |")


if __name__ == "__main__":
    main()
