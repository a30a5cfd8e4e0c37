#!/usr/bin/env python3
"""The cost model of one training step (docs/scaling.md, "The cost model").

    step time = compute + the time of each collective the step issues

Compute is measured: the step time of the same program, at the same world
size, with the fake backend (so every rank holds the shards and buffers it
would, and nothing is sent), with as many processes on the machine as the
real job has. The collectives come from the plan report of that run
(`last_step_calls`: each operation's kind and the bytes this rank sends),
and are priced by the algorithm ddp's backend runs for them (Gloo here;
NCCL's ring for the GPU predictions) over a topology of H hosts of G ranks
(ranks 0 .. G-1 on the first host, and so on) whose hosts are joined by
links of bandwidth B (bytes/s, each way) and one-way latency L (s). Ranks
within a host are taken to cost nothing to each other (a host's loopback or
NVLink is an order of magnitude faster than its link); a collective's time
is set by the host links it crosses. Each operation is priced on its own
group (`groups` in the report): W its ranks, g of them per host; a group
within one host costs nothing; and since every rank runs the same step, the
G / g groups like it on a host cross that host's link at the same time
(HSDP's replicate groups: one per local rank), so each gets B g / G.

Two bandwidths. B is what a link carries each way while every host sends at
once, which is what a collective does (a ring's steps, an exchange, the
hosts' parts of a shared allreduce); B1 is what one transfer gets when it
alone crosses (send, recv, gather, scatter; a broadcast's round with fewer
sends across than hosts gets up to B1 each). On a real cluster's switch
they are the same. On the simulated cluster they are not: ddp_netsim
forwards every frame on one thread and the kernels of all hosts share the
same 2 cores, so each of four hosts sending at once at "10 Gbit/s" gets
about half of what one lone stream gets (0.35 to 0.69), each of two hosts
sending to each other 0.55 to 1.05 (validate.py probes both: one stream,
and every host streaming to the next at once).

Per operation (s the bytes this rank sends, as the plan counts them; n the
bytes of its tensor here; B the link's share):

    allreduce in shared memory across hosts (Gloo, above 64 KiB, a group of
    g >= 2 ranks on each of h >= 2 hosts: DDP's buckets, which lie in shared
    buffers): each host's ranks reduce in shared memory, local rank j takes
    the j-th of g parts and reduces it with its peers of the other hosts
    (a direct exchange on two hosts, a reduce-scatter and an all-gather on
    more: Note [Reduced among hosts]); a host's link carries 2 (h - 1) / h
    of n, in one round of latency on two hosts, two on more:
        (1 or 2) L + 2 (h - 1) n / (h B)

    allreduce, ring (Gloo above 64 KiB or 8 ranks; NCCL):
        2 (W - 1) steps of latency, and s / B: each step moves one
        rank's chunk over every host link at once
    allreduce, exchange (Gloo at most 64 KiB and 8 ranks): L + g (W - g) n / B
        (every rank sends its whole buffer to every other at once)
    allgather (ring):  (W - 1) L + s / B
    reduce_scatter (Gloo's direct exchange): L + g s (W - g) / ((W - 1) B);
        NCCL's ring: (W - 1) L + s / B
    broadcast (Gloo's binomial tree): ceil(log2 W) rounds; in round i the
        ranks holding the tensor send it to the ranks 2^i further from the
        root, and a round with c sends across host links, k of them at most
        into or out of one host, costs L + n max(k / B1, c / (h B)) (a
        host's link carries its k sends at most at a lone transfer's rate,
        the switch all c at most at h B; 0 when none crosses), averaged
        over the group's ranks as the root;
        NCCL's pipelined chain: (W - 1) L + n / B
    barrier: 2 ceil(log2 W) L
    alltoall: L + s / B; send, recv, gather, scatter: L + s / B1

No overlap with compute is assumed: on this 2-core machine a collective's
own CPU work (Gloo's threads, the kernel's TCP) competes with compute, so
what DDP's buckets hide behind backward on a GPU is not hidden here. And on
a simulated cluster, where every host is this machine, the bytes cost CPU
time too (measured by link_probe.py: ns per byte through the switch, and
through loopback between ranks of one host; and what the collectives copy
and reduce in memory themselves, call_memory_bytes, at a memory copy's ns
per byte). A step's network time t_n and that CPU time spread over the
cores, t_c, combine as (t_n^p + t_c^p)^(1/p), p = 2.5 (CPU_OVERLAP_P):
more than the longer of the two, which would keep the links and the cores
busy together throughout, less than their sum. Where the model is known
to be wrong: docs/scaling.md.
"""

import argparse
import functools
import json
import math
import sys

EXCHANGE_MAX_BYTES = 64 * 1024
EXCHANGE_MAX_RANKS = 8


def group_shape(members, per_host):
    """(ranks, hosts spanned, ranks of the group per host, groups alike sharing each host's link)."""
    hosts = {}
    for rank in members:
        hosts[rank // per_host] = hosts.get(rank // per_host, 0) + 1
    g = max(hosts.values())
    # Every rank runs the same step: the host's other ranks are in groups
    # like this one, issuing the same operation at once over the same link.
    return len(members), len(hosts), g, max(1, per_host // g)


def hierarchical(op, n, members, per_host, backend):
    """Whether Gloo reduces this allreduce in shared memory within each host and among hosts
    over the links: a group with the same number (at least two) of ranks on every host it spans,
    on two hosts or more, a buffer past the exchange's 64 KiB. Taken to hold for every such
    allreduce: DDP's buckets lie in shared buffers (a private tensor would take the ring)."""
    if backend != "gloo" or op not in ("allreduce", "allreduce_coalesced") or n <= EXCHANGE_MAX_BYTES:
        return False
    hosts = {}
    for rank in members:
        hosts[rank // per_host] = hosts.get(rank // per_host, 0) + 1
    return len(hosts) >= 2 and min(hosts.values()) == max(hosts.values()) >= 2


def binomial_rounds(members, per_host):
    """Gloo's broadcast, for each root of the group: per round, (the most sends into or out of one
    host that cross its link, the sends that cross, the sends within a host). Worked out once per
    group (ZeRO broadcasts on the same group W times a step)."""
    return _binomial_rounds(tuple(members), per_host)


@functools.lru_cache(maxsize=None)
def _binomial_rounds(members, per_host):
    size = len(members)
    dim = max(1, math.ceil(math.log2(size)))
    roots = []
    for root in range(size):
        rounds = []
        # Round i: virtual rank v (v < 2^i, rank (v + root) mod size) sends to v + 2^i.
        for i in range(dim):
            out, into, crossing, local = {}, {}, 0, 0
            for v in range(min(1 << i, size)):
                peer = v + (1 << i)
                if peer >= size:
                    continue
                a = members[(v + root) % size] // per_host
                b = members[(peer + root) % size] // per_host
                if a == b:
                    local += 1
                else:
                    crossing += 1
                    out[a] = out.get(a, 0) + 1
                    into[b] = into.get(b, 0) + 1
            rounds.append((max(list(out.values()) + list(into.values()) + [0]), crossing, local))
        roots.append(rounds)
    return roots


def call_seconds(op, sent, n, members, per_host, bandwidth, latency, backend="gloo", lone_bandwidth=None):
    """Seconds one operation takes: `sent` the plan's bytes for this rank, `n` its tensor's bytes,
    `members` the world ranks of its group, `per_host` ranks on each host. `bandwidth` is what a
    link carries each way while every host sends at once (a collective's usual traffic);
    `lone_bandwidth` (default the same) what one transfer gets crossing alone (a broadcast's
    round with one send across, a send): on a real switch the two are equal, on the simulated
    cluster's one-thread switch the first is less (the module's text)."""
    lone = bandwidth if lone_bandwidth is None else lone_bandwidth
    world, hosts, g, sharing = group_shape(members, per_host)
    if world <= 1 or hosts <= 1:
        return 0.0  # within one host
    if hierarchical(op, n, members, per_host, backend):
        return (1 if hosts == 2 else 2) * latency + sharing * 2 * (hosts - 1) * n / (hosts * bandwidth)
    if op in ("allreduce", "allreduce_coalesced"):
        if backend == "gloo" and n <= EXCHANGE_MAX_BYTES and world <= EXCHANGE_MAX_RANKS:
            return latency + sharing * g * (world - g) * n / bandwidth
        return 2 * (world - 1) * latency + sharing * sent / bandwidth
    if op in ("allgather", "allgather_into_tensor"):
        return (world - 1) * latency + sharing * sent / bandwidth
    if op in ("reduce_scatter", "reduce_scatter_tensor"):
        if backend == "nccl":  # a ring
            return (world - 1) * latency + sharing * sent / bandwidth
        return latency + sharing * g * sent * (world - g) / ((world - 1) * bandwidth)
    if op == "broadcast" and backend == "nccl":  # a pipelined chain
        return (world - 1) * latency + sharing * n / bandwidth
    if op == "broadcast":
        roots = binomial_rounds(members, per_host)
        # A host's link carries its k sends at B1 at most, and the switch all the round's sends
        # at h B at most (every host sending at once gets B).
        return sum((latency + sharing * n * max(k / lone, crossing / (hosts * bandwidth))) if k else 0.0
                   for rounds in roots for k, crossing, _ in rounds) / len(roots)
    if op == "barrier":
        return 2 * math.ceil(math.log2(world)) * latency
    if op == "alltoall":  # every host sends at once
        return latency + sharing * max(sent, n) / bandwidth
    # send, recv, gather, scatter: their bytes over one link.
    return latency + sharing * max(sent, n) / lone


def call_bytes(op, sent, n, members, per_host, backend="gloo"):
    """(bytes crossing host links, bytes between ranks of one host over TCP) that all groups like
    this one move in the world for this operation; a group within one host moves its bytes in
    shared memory (Gloo), counted as neither."""
    world, hosts, g, _ = group_shape(members, per_host)
    if world <= 1 or hosts <= 1:
        return 0.0, 0.0
    if hierarchical(op, n, members, per_host, backend):
        return 2.0 * (hosts - 1) * n, 0.0  # each host's link 2 (h - 1) / h of n; within hosts shared memory
    if op == "broadcast":
        roots = binomial_rounds(members, per_host)
        crossing = sum(c for rounds in roots for _, c, _ in rounds) / len(roots)
        local = sum(lo for rounds in roots for _, _, lo in rounds) / len(roots)
        return crossing * n, local * n
    elif op in ("reduce_scatter", "reduce_scatter_tensor") or (
            op in ("allreduce", "allreduce_coalesced") and n <= EXCHANGE_MAX_BYTES and world <= EXCHANGE_MAX_RANKS):
        total, crossing = world * max(sent, n), (world - g) / (world - 1)
    else:  # rings: one hop in world / hosts crosses a host link
        total, crossing = world * max(sent, n), hosts / world
    return total * crossing, total * (1 - crossing)


# How a step's network time t_n and its CPU time t_c (a simulated cluster's) combine:
# (t_n^p + t_c^p)^(1/p). Their max (p infinite) would have the links and the cores busy together
# the whole time; their sum (p = 1) never together. Measured steps lie between: the links idle
# while the cores catch up on a transfer's copies and the ranks wait for each other. p = 2.5 was
# chosen on the runs of 2026-12-07-2 and -3 (docs/scaling.md): with it all 192 jobs of the three
# runs that shaped the model lie within 20% (185 with the max), and of the runs made after, 61 of
# the fifth's 64 and all 64 of the sixth's (three passes).
CPU_OVERLAP_P = 2.5

# A reduction out = a + b reads two bytes and writes one for each byte of out: taken as 1.5 of a
# copy's cost per byte (a copy reads one and writes one).
REDUCTION_COPIES = 1.5


def call_memory_bytes(op, sent, n, members, per_host, backend="gloo"):
    """The bytes this rank's CPU copies for the operation outside the kernels' TCP, each
    reduction counted as REDUCTION_COPIES copies of its output (Gloo's algorithms, ddp's shared
    buffers; docs/scaling.md). The kernels' copies are the link and loopback costs above."""
    world, hosts, g, _ = group_shape(members, per_host)
    if world <= 1 or backend != "gloo":
        return 0.0
    if op in ("reduce_scatter", "reduce_scatter_tensor"):
        # Every peer's chunk added to this rank's (over TCP, or read from shared memory).
        return REDUCTION_COPIES * (world - 1) * n
    if hosts <= 1:
        return 0.0  # other operations within a host: FSDP's gathers in common memory copy nothing
    if hierarchical(op, n, members, per_host, backend):
        part = n / g
        # This rank's part of the host's g buffers reduced; among the hosts, on two the exchange
        # (its part copied in and out of the receive buffer, one reduction), on more this rank's
        # chunk copied and h - 1 reductions of it; the result copied into the host's g - 1 others.
        among = (2 + REDUCTION_COPIES) * part if hosts == 2 else (1 + REDUCTION_COPIES * (hosts - 1)) * part / hosts
        return REDUCTION_COPIES * (g - 1) * part + among + (g - 1) * part
    if op in ("allreduce", "allreduce_coalesced"):
        if n <= EXCHANGE_MAX_BYTES and world <= EXCHANGE_MAX_RANKS:
            return REDUCTION_COPIES * (world - 1) * n
        return REDUCTION_COPIES * (world - 1) / world * n  # the ring's reduce-scatter half
    if op in ("allgather", "allgather_into_tensor"):
        return n  # this rank's own input into the output
    return 0.0


def predict(compute_s, report, per_host, bandwidth, latency, backend="gloo", cpu=None, lone_bandwidth=None):
    """(step seconds, communication seconds) for the last step of a plan report. `bandwidth` and
    `lone_bandwidth` as call_seconds takes them.

    `cpu`, for a simulated cluster on one machine: {"cores", "ns_per_byte_link",
    "ns_per_byte_loopback", "ns_per_byte_memory"}. The communication then also costs the
    machine CPU time (every byte through the kernels and the switch, and the bytes the
    collectives copy and reduce in memory, call_memory_bytes, at a copy's cost per byte): a
    step's communication combines its network time and that CPU time over the cores as
    CPU_OVERLAP_P says."""
    groups = report["groups"]
    world = len(groups[0]) if groups else 1
    network = 0.0
    crossing = loopback = memory = 0.0
    for op, sent, n, group in report["last_step_calls"]:
        members = groups[group]
        network += call_seconds(op, sent, n, members, per_host, bandwidth, latency, backend, lone_bandwidth)
        c, lo = call_bytes(op, sent, n, members, per_host, backend)
        instances = world / len(members)
        crossing += c * instances
        loopback += lo * instances
        memory += call_memory_bytes(op, sent, n, members, per_host, backend) * world  # every rank's
    comm = network
    if cpu is not None:
        cpu_s = (crossing * cpu["ns_per_byte_link"] + loopback * cpu["ns_per_byte_loopback"] +
                 memory * cpu.get("ns_per_byte_memory", 0.0)) * 1e-9 / cpu["cores"]
        comm = (network ** CPU_OVERLAP_P + cpu_s ** CPU_OVERLAP_P) ** (1 / CPU_OVERLAP_P)
    return compute_s + comm, comm


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", help="a plan report, plan_rank_<R>.json (ddprun --plan, DDP_PLAN_REPORT)")
    parser.add_argument("--compute-ms", type=float, required=True, help="the step's compute, measured")
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--per-host", type=int, required=True, help="ranks per host")
    parser.add_argument("--gbit", type=float, required=True,
                        help="each host link's bandwidth each way while every host sends at once, Gbit/s")
    parser.add_argument("--lone-gbit", type=float,
                        help="a transfer's bandwidth when it alone crosses (default --gbit), Gbit/s")
    parser.add_argument("--latency-us", type=float, required=True, help="one-way latency between hosts")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = parser.parse_args()
    report = json.load(open(args.report))
    if report["world_size"] != args.hosts * args.per_host:
        sys.exit(f"cost_model: the report is of world {report['world_size']}, not {args.hosts} x {args.per_host}")
    step, comm = predict(args.compute_ms / 1e3, report, args.per_host, args.gbit * 1e9 / 8,
                         args.latency_us / 1e6, args.backend,
                         lone_bandwidth=None if args.lone_gbit is None else args.lone_gbit * 1e9 / 8)
    print(f"cost_model: step {step * 1e3:.1f} ms = compute {args.compute_ms:.1f} ms + communication {comm * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
