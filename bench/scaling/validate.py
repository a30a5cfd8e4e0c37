#!/usr/bin/env python3
"""The cost model against jobs on simulated clusters (docs/scaling.md).

For each topology (hosts x ranks per host), each strategy (DDP, ZeRO, FSDP,
HSDP) and each link (bandwidth, latency): the compute of a step (the median
of --compute-runs fake runs, three by default, made right before the job) and its collectives from the
fake backend (as many processes at once as the job has, each playing its
rank, writing its plan report), the link's figures (the median of
--probe-repeats probes each, three by default: a lone stream's latency, bandwidth and CPU per byte, and the
bandwidth of each stream while every host streams to the next at once,
the collectives' pattern), the model's prediction from them, and the step time of the real
job on network namespaces joined by ddp_netsim's switch (examples/gpt
under ddprun, one ddprun per host). With --passes N the whole matrix runs
N times, one pass after another, and a job's compute, step time and
probes are the medians over the passes (docs/scaling.md: the spread lies
in the machine's state over minutes). Prints a table, measured against
predicted.

    sudo bench/scaling/validate.py --build build [--passes 3 --compute-runs 1 --probe-repeats 1] [--quick] [--out DIR]

Needs root (network namespaces) and an idle machine: the figures are step
times.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cost_model  # noqa: E402
import link_probe  # noqa: E402

# A GPT whose gradients (51 MB) take longer to send over a 1 Gbit/s link
# than its step takes to compute on one core, so that the network decides.
MODEL = ["--layers", "4", "--embd", "512", "--heads", "8", "--block", "32", "--batch", "1",
         "--steps", "10", "--sample", "0", "--log-every", "1000", "--threads", "1", "--report"]
STRATEGIES = {
    "ddp": ["--parallel", "ddp"],
    "zero": ["--parallel", "zero"],
    "fsdp": ["--parallel", "fsdp"],
    "hsdp": ["--parallel", "fsdp", "--strategy", "hybrid"],
}
TOPOLOGIES = [(2, 1), (2, 2), (4, 1), (4, 2)]
LINKS = [(1000, 100), (1000, 1000), (10000, 100), (10000, 1000)]  # Mbit/s, one-way latency in us
RESULT = re.compile(r"gpt_result .*rank=(\d+) world=(\d+).* tokens_per_s=([0-9.]+)")


def step_seconds(output, world):
    """Each rank's step time from its gpt_result line (batch 1 x block 32 per rank)."""
    block = int(MODEL[MODEL.index("--block") + 1])
    batch = int(MODEL[MODEL.index("--batch") + 1])
    times = {}
    for match in RESULT.finditer(output):
        rank, tokens_per_s = int(match.group(1)), float(match.group(3))
        times[rank] = batch * world * block / tokens_per_s
    return times


def collect(procs, timeout, what):
    """The processes' output together; exits naming `what` when one failed."""
    output = ""
    for proc in procs:
        text, _ = proc.communicate(timeout=timeout)
        output += text
        if proc.returncode != 0:
            sys.exit(f"validate: {what} failed:\n{text}")
    return output


def fake_run(build, hosts, per_host, strategy, out, link=None):
    """Compute per step (mean over the ranks, all running at once) and rank 0's plan report.
    With `link` (DDP_FAKE_LINK's value), the step time on that simulated link instead."""
    world = hosts * per_host
    folder = os.path.join(out, f"fake_{strategy}_{hosts}x{per_host}" + ("_link" if link else ""))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        env.update(DDP_BACKEND="fake", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                   LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(rank // per_host), DDP_PLAN_REPORT=folder,
                   OMP_NUM_THREADS="1",
                   # Buffers shared among a host's ranks where the real job's Gloo shares them
                   # (FSDP's gathers on one host in common memory: no copies).
                   DDP_FAKE_SHM="1")
        if link:
            env["DDP_FAKE_LINK"] = link
        procs.append(subprocess.Popen([f"{build}/examples/gpt_train"] + MODEL + STRATEGIES[strategy], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    output = collect(procs, 600, f"the fake run of {strategy} on {hosts}x{per_host}")
    times = step_seconds(output, world)
    report = json.load(open(os.path.join(folder, "plan_rank_0.json")))
    return statistics.mean(times.values()), report


def cluster(*args):
    subprocess.run(["bash", os.path.join(HERE, "cluster.sh")] + [str(a) for a in args], check=True,
                   stdout=subprocess.DEVNULL)


def probe(server_host, client_host, address):
    server = subprocess.Popen(["bash", os.path.join(HERE, "cluster.sh"), "exec", str(server_host), sys.executable,
                               os.path.join(HERE, "link_probe.py"), "server"])
    text = subprocess.run(["bash", os.path.join(HERE, "cluster.sh"), "exec", str(client_host), sys.executable,
                           os.path.join(HERE, "link_probe.py"), "client", address, "256"],
                          check=True, capture_output=True, text=True, timeout=300).stdout
    server.wait(timeout=60)
    return {key: float(value) for key, value in re.findall(r"(\w+)=([0-9.]+)", text)}


def probe_ring(hosts):
    """Every host streaming to the next at once (host i to host i + 1, the last to the first; on two
    hosts each to the other), as a collective's steps do: the median of the streams' Mbit/s."""
    servers = [subprocess.Popen(["bash", os.path.join(HERE, "cluster.sh"), "exec", str(h), sys.executable,
                                 os.path.join(HERE, "link_probe.py"), "server"]) for h in range(hosts)]
    clients = [subprocess.Popen(["bash", os.path.join(HERE, "cluster.sh"), "exec", str(h), sys.executable,
                                 os.path.join(HERE, "link_probe.py"), "client", f"10.77.0.{(h + 1) % hosts + 1}",
                                 "256"], stdout=subprocess.PIPE, text=True) for h in range(hosts)]
    rates = []
    for client in clients:
        text, _ = client.communicate(timeout=300)
        if client.returncode != 0:
            sys.exit("validate: a ring probe's stream failed")
        rates.append(float(re.search(r"mbit_s=([0-9.]+)", text).group(1)))
    for server in servers:
        server.wait(timeout=60)
    return statistics.median(rates)


def probe_link(hosts, repeats=3):
    """Between hosts 0 and 1: one-way latency (s), a lone stream's bandwidth (bytes/s) and CPU ns
    per byte; the bandwidth of each stream while every host streams to the next at once
    (probe_ring); and the CPU ns per byte between two processes of host 0 (loopback). Each the
    median of `repeats` probes: one probe's CPU per byte (the machine's busy time over a transfer of
    a few tenths of a second, in 10 ms ticks) moved by up to a factor of two from one cluster to the
    next."""
    links = [probe(1, 0, "10.77.0.2") for _ in range(repeats)]
    rings = [probe_ring(hosts) for _ in range(repeats)]
    loopbacks = [probe(0, 0, "10.77.0.1") for _ in range(repeats)]
    return dict(latency=statistics.median(p["rtt_us"] for p in links) * 1e-6 / 2,
                bandwidth=statistics.median(p["mbit_s"] for p in links) * 1e6 / 8,
                ring_bandwidth=statistics.median(rings) * 1e6 / 8,
                ns_link=statistics.median(p["cpu_ns_per_byte"] for p in links),
                ns_loopback=statistics.median(p["cpu_ns_per_byte"] for p in loopbacks))


def measure_compute(build, hosts, per_host, strategy, out, runs):
    """(compute seconds, plan report): the median of `runs` fake runs' compute; one run's moved by
    up to a third from one run to the next on these 2 cores (2 x 2 DDP: 216 and 288 ms)."""
    results = [fake_run(build, hosts, per_host, strategy, out) for _ in range(runs)]
    compute = statistics.median(c for c, _ in results)
    print(f"validate: compute {strategy} {hosts}x{per_host}: {compute * 1e3:.1f} ms (median of "
          + ", ".join(f"{c * 1e3:.0f}" for c, _ in results) + ")", flush=True)
    return compute, results[0][1]


def real_run(build, hosts, per_host, strategy, port, out):
    """Rank 0's step time of the real job on the simulated cluster."""
    world = hosts * per_host
    procs = []
    env = dict(os.environ, DDP_JOB_ID=f"validate-{port}")
    for host in range(hosts):
        procs.append(subprocess.Popen(
            ["bash", os.path.join(HERE, "cluster.sh"), "exec", str(host), f"{build}/ddprun", "--nnodes", str(hosts),
             "--node-rank", str(host), "--nproc-per-node", str(per_host), "--master-addr", "10.77.0.1",
             "--master-port", str(port), "--no-prefix", f"{build}/examples/gpt_train"] + MODEL + STRATEGIES[strategy],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    output = collect(procs, 900, f"the real run of {strategy} on {hosts}x{per_host}")
    with open(os.path.join(out, f"real_{strategy}_{hosts}x{per_host}_{port}.log"), "w") as log:
        log.write(output)
    return step_seconds(output, world)[0]


def price(rows):
    """Sets each row's prediction (predicted_ms, comm_ms, nominal_ms, error) from its compute, its
    plan and the links' figures, pooled. The CPU per byte through the switch is a property of the
    machine and the link's rate, and through loopback of the machine alone, while one cluster's probes
    (three transfers of a few tenths of a second, in 10 ms ticks of busy time) still moved by
    half from one cluster to the next (0.97 to 1.53 ns at 10 Gbit/s): the model takes the median
    of every cluster's probe of the same rate, and of every loopback probe."""
    clusters = {(r["hosts"], r["per_host"], r["mbit"], r["latency_us"]): r for r in rows}.values()
    ns_link = {mbit: statistics.median(c["cpu_ns_per_byte_link"] for c in clusters if c["mbit"] == mbit)
               for mbit in {c["mbit"] for c in clusters}}
    ns_loopback = statistics.median(c["cpu_ns_per_byte_loopback"] for c in clusters)
    # What a lone stream gets and what each stream gets while every host streams at once: properties
    # of the switch, the rate and the number of hosts, while one cluster's probes of them moved
    # (a lone stream at "10 Gbit/s" from 4.7 to 8.2 Gbit/s, each of four hosts' streams from 2.5
    # to 3.8 in one run): the medians over the clusters of the same hosts and rate (a run without
    # the second probe takes the lone stream's for both).
    pooled = {}
    for c in clusters:
        lone, ring = pooled.setdefault((c["hosts"], c["mbit"]), ([], []))
        lone.append(c["probe_mbit"])
        ring.append(c.get("probe_ring_mbit", c["probe_mbit"]))
    pooled = {key: (statistics.median(lone), statistics.median(ring)) for key, (lone, ring) in pooled.items()}
    for r in rows:
        cpu = {"cores": os.cpu_count(), "ns_per_byte_link": ns_link[r["mbit"]], "ns_per_byte_loopback": ns_loopback,
               "ns_per_byte_memory": r["cpu_ns_per_byte_memory"]}
        compute, plan, per_host = r["compute_ms"] / 1e3, r["plan"], r["per_host"]
        # Collectives at the bandwidth of every host streaming at once, a transfer crossing alone at
        # the lone stream's.
        lone_mbit, ring_mbit = pooled[(r["hosts"], r["mbit"])]
        predicted, comm = cost_model.predict(compute, plan, per_host, ring_mbit * 1e6 / 8,
                                             r["probe_latency_us"] * 1e-6, cpu=cpu,
                                             lone_bandwidth=lone_mbit * 1e6 / 8)
        nominal, _ = cost_model.predict(compute, plan, per_host, r["mbit"] * 1e6 / 8, r["latency_us"] * 1e-6, cpu=cpu)
        r.update(model_cpu_ns_per_byte_link=ns_link[r["mbit"]], model_cpu_ns_per_byte_loopback=ns_loopback,
                 model_lone_mbit=lone_mbit, model_ring_mbit=ring_mbit,
                 comm_ms=comm * 1e3, predicted_ms=predicted * 1e3, nominal_ms=nominal * 1e3,
                 error=predicted / (r["measured_ms"] / 1e3) - 1)


def print_table(rows, emulate):
    print()
    extra = " emulated ms | error |" if emulate else ""
    print("| hosts x ranks | link | probed: lone (ring) | strategy | compute ms | predicted ms | measured ms | error |" + extra)
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if emulate else ""))
    for r in rows:
        emulated = f" {r['emulated_ms']:.0f} | {r['emulated_error']:+.1%} |" if emulate else ""
        print(f"| {r['hosts']} x {r['per_host']} | {r['mbit'] / 1000:g} Gbit/s, {r['latency_us'] / 1000:g} ms "
              f"| {r['probe_mbit']:.0f} ({r.get('probe_ring_mbit', r['probe_mbit']):.0f}) Mbit/s, "
              f"{r['probe_latency_us']:.0f} us | {r['strategy']} "
              f"| {r['compute_ms']:.0f} | {r['predicted_ms']:.0f} | {r['measured_ms']:.0f} | {r['error']:+.1%} |"
              + emulated)
    worst = max(abs(r["error"]) for r in rows)
    print(f"\nvalidate: {len(rows)} jobs, worst error {worst:.1%}, "
          f"{sum(abs(r['error']) <= 0.2 for r in rows)} within 20%")
    if emulate:
        emulated = [r["emulated_error"] for r in rows]
        print(f"validate: emulated (DDP_FAKE_LINK): worst error {max(abs(e) for e in emulated):.1%}, "
              f"{sum(abs(e) <= 0.2 for e in emulated)} within 20%")


def run_matrix(args, build, topologies, links, ns_memory, earlier, port):
    """One pass over every link, topology and strategy: a row per job (its cluster's probes, its
    compute and plan, the real job's step time), and the next free port."""
    rows = []
    for mbit, latency_us in links:
        for hosts, per_host in topologies:
            if args.measured:
                first = earlier[(hosts, per_host, mbit, latency_us, "ddp")]
                probed = dict(latency=first["probe_latency_us"] * 1e-6, bandwidth=first["probe_mbit"] * 1e6 / 8,
                              ring_bandwidth=first.get("probe_ring_mbit", first["probe_mbit"]) * 1e6 / 8,
                              ns_link=first.get("cpu_ns_per_byte_link"),
                              ns_loopback=first.get("cpu_ns_per_byte_loopback"))
                if probed["ns_link"] is None:  # an earlier run without them: probe this cluster's CPU alone
                    cluster("up", f"{build}/bench/ddp_netsim", hosts, mbit, latency_us)
                    again = probe_link(hosts)
                    probed.update(ns_link=again["ns_link"], ns_loopback=again["ns_loopback"])
                    cluster("down")
            else:
                cluster("up", f"{build}/bench/ddp_netsim", hosts, mbit, latency_us)
                probed = probe_link(hosts, args.probe_repeats)
            print("validate: probed " + json.dumps(probed), flush=True)
            for strategy in STRATEGIES:
                port += 1
                # Measured right before the job: the machine's speed drifts by a sixth within
                # half an hour (2 x 1 DDP's compute: 96 ms, then 113 ms 17 minutes later).
                compute, report = measure_compute(build, hosts, per_host, strategy, args.out, args.compute_runs)
                if args.measured:
                    measured = earlier[(hosts, per_host, mbit, latency_us, strategy)]["measured_ms"] / 1e3
                else:
                    runs = []
                    for _ in range(args.repeats):
                        port += 1
                        runs.append(real_run(build, hosts, per_host, strategy, port, args.out))
                    measured = statistics.median(runs)
                emulated = None
                if args.emulate:
                    # The fake link has one bandwidth: what a link carries while every host sends.
                    link = (f"gbit={probed['ring_bandwidth'] * 8 / 1e9:.4f},"
                            f"latency_us={probed['latency'] * 1e6:.1f},per_host={per_host},"
                            f"cpu_ns_link={probed['ns_link']:.3f},cpu_ns_loopback={probed['ns_loopback']:.3f}")
                    emulated = fake_run(build, hosts, per_host, strategy, args.out, link)[0]
                row = dict(hosts=hosts, per_host=per_host, mbit=mbit, latency_us=latency_us, strategy=strategy,
                           probe_mbit=probed["bandwidth"] * 8 / 1e6,
                           probe_ring_mbit=probed["ring_bandwidth"] * 8 / 1e6,
                           probe_latency_us=probed["latency"] * 1e6,
                           cpu_ns_per_byte_link=probed["ns_link"], cpu_ns_per_byte_loopback=probed["ns_loopback"],
                           cpu_ns_per_byte_memory=ns_memory, compute_ms=compute * 1e3,
                           measured_ms=measured * 1e3,
                           plan={"groups": report["groups"], "last_step_calls": report["last_step_calls"]})
                if not args.measured:
                    row.update(measured_runs_ms=[r * 1e3 for r in runs])
                if emulated is not None:
                    row.update(emulated_ms=emulated * 1e3, emulated_error=emulated / measured - 1)
                rows.append(row)
                print("validate: " + json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
            if not args.measured:
                cluster("down")
    return rows, port


PROBED = ("probe_mbit", "probe_ring_mbit", "probe_latency_us", "cpu_ns_per_byte_link", "cpu_ns_per_byte_loopback")


def combine(passes):
    """One row per job from the passes' rows (the same jobs in the same order): the medians of its
    compute, its step time and its cluster's probes over the passes (price() pools the probes over
    the clusters of the same hosts and rate, so each pass's probes count alike); each pass's
    figures kept beside them (pass_compute_ms, pass_measured_ms, measured_runs_ms, pass_probes)."""
    if len(passes) == 1:
        return passes[0]
    rows = []
    for same in zip(*passes):
        row = dict(same[0])
        for key in ("compute_ms", "measured_ms") + PROBED:
            row[key] = statistics.median(r[key] for r in same)
        row.update(pass_compute_ms=[r["compute_ms"] for r in same], pass_measured_ms=[r["measured_ms"] for r in same],
                   measured_runs_ms=[t for r in same for t in r["measured_runs_ms"]],
                   pass_probes={key: [r[key] for r in same] for key in PROBED})
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default="/tmp/ddp_scaling_validate")
    parser.add_argument("--quick", action="store_true", help="2 hosts x 1 rank, 1 Gbit/s, both latencies")
    parser.add_argument("--emulate", action="store_true",
                        help="also run each job's fake run on a simulated link (DDP_FAKE_LINK, this cluster's "
                        "probed figures): the step time it gives is the emulated prediction, overlap included")
    parser.add_argument("--compute-runs", type=int, default=3,
                        help="fake runs per job, right before it; the model takes their median compute")
    parser.add_argument("--repeats", type=int, default=1,
                        help="launches of each real job; its step time is their median (mean of two)")
    parser.add_argument("--passes", type=int, default=1,
                        help="runs of the whole matrix, one after another, each cluster brought up anew in each; a "
                        "job's compute, step time and probes are the medians over the passes")
    parser.add_argument("--probe-repeats", type=int, default=3,
                        help="probes of each kind per cluster (the median of them); with --passes, also per pass")
    parser.add_argument("--measured", help="a results.json of an earlier run: take its real jobs' step times and "
                        "its probes instead of running them again (the fake runs and the model run anew)")
    parser.add_argument("--reprice", help="a results.json of an earlier run: the model alone again on its "
                        "compute, plans, probes and step times (after a change to the model; runs nothing)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.reprice:
        rows = json.load(open(args.reprice))
        price(rows)
        print_table(rows, args.emulate and all("emulated_ms" in r for r in rows))
        json.dump(rows, open(os.path.join(args.out, "results.json"), "w"), indent=1)
        return
    build = os.path.abspath(args.build)
    topologies = [(2, 1)] if args.quick else TOPOLOGIES
    links = LINKS[:2] if args.quick else LINKS
    # The CPU per byte of a memory copy, on the idle machine, before anything runs.
    ns_memory = link_probe.memory_ns_per_byte()
    print(f"validate: a memory copy costs {ns_memory:.3f} ns of CPU per byte", flush=True)
    earlier = {}
    if args.measured:
        for r in json.load(open(args.measured)):
            earlier[(r["hosts"], r["per_host"], r["mbit"], r["latency_us"], r["strategy"])] = r
    if args.passes > 1 and (args.measured or args.emulate):
        sys.exit("validate: --passes takes neither --measured nor --emulate")
    # Every job in each pass, the passes one after another: a job's step time moved by up to a
    # quarter between runs of the matrix made minutes apart (4 x 1 ZeRO at 10 Gbit/s, 0.1 ms: 573,
    # 482, 619 and 477 ms) while its launches back to back agreed within a few percent, so the
    # spread lies in the machine's state over minutes: passes sample it, and a job's compute and
    # step time are the medians over them.
    passes = []
    port = 29600
    try:
        for number in range(args.passes):
            if args.passes > 1:
                print(f"validate: pass {number + 1} of {args.passes}", flush=True)
            rows, port = run_matrix(args, build, topologies, links, ns_memory, earlier, port)
            passes.append(rows)
            if args.passes > 1:  # each pass kept as it ends
                json.dump(rows, open(os.path.join(args.out, f"pass_{number + 1}.json"), "w"), indent=1)
    finally:
        if not args.measured:
            cluster("down")
    rows = combine(passes)
    price(rows)
    print_table(rows, args.emulate)
    json.dump(rows, open(os.path.join(args.out, "results.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
