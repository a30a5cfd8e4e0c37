"""The simulated clusters' cost model (bench/scaling/cost_model.py; docs/scaling.md,
"The cost model"): Gloo's algorithms priced over host links with two bandwidths (B while
every host sends at once, B1 for a transfer alone), and a step's network and CPU times
combined as CPU_OVERLAP_P says; and how validate.py combines its passes.

Usage: cost_model_test.py <bench/scaling directory>. Prints
"cost_model_test: N of N checks passed" at the end."""

import math
import os
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cost_model as cm  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks("cost_model_test")

L = 1e-4  # one-way latency, s
B1 = 1e9  # a lone transfer, bytes/s
n = 4 << 20  # a tensor past the exchange's 64 KiB

# Within one host nothing crosses a link.
check("within-a-host", cm.call_seconds("allreduce", n, n, [0, 1], 2, B1, L) == 0.0)

# Broadcast on 2 hosts of one rank: one round, one send across, at the lone rate whatever B is.
got = cm.call_seconds("broadcast", n, n, [0, 1], 1, 0.5 * B1, L, lone_bandwidth=B1)
check("broadcast-2x1-alone", math.isclose(got, L + n / B1), got)

# Broadcast on 4 hosts of one rank, on a real switch (B = B1): two rounds of L + n / B for every
# root (one send across, then two, each host's link carrying one).
got = cm.call_seconds("broadcast", n, n, [0, 1, 2, 3], 1, B1, L)
check("broadcast-4x1-switch", math.isclose(got, 2 * (L + n / B1)), got)

# On a switch that carries 4 B = 1.6 B1 in all: the second round's two sends share it, each at
# 0.8 B1, while the first round's one send has its link's B1.
got = cm.call_seconds("broadcast", n, n, [0, 1, 2, 3], 1, 0.4 * B1, L, lone_bandwidth=B1)
check("broadcast-4x1-shared-switch", math.isclose(got, (L + n / B1) + (L + n / (0.8 * B1))), got)

# The shared allreduce across hosts: 2 (h - 1) / h of the buffer over each host's link, in one
# round of latency on two hosts, two on more.
got = cm.call_seconds("allreduce", n, n, [0, 1, 2, 3], 2, B1, L)
check("shared-allreduce-2x2", math.isclose(got, L + n / B1), got)
got = cm.call_seconds("allreduce", n, n, list(range(8)), 2, B1, L)
check("shared-allreduce-4x2", math.isclose(got, 2 * L + 1.5 * n / B1), got)

# A ring allreduce on 2 hosts of one rank: 2 (W - 1) steps of latency and the bytes sent at B.
report = {"groups": [[0, 1]], "last_step_calls": [["allreduce", n, n, 0]]}
network = 2 * L + n / (0.5 * B1)
step, comm = cm.predict(0.1, report, 1, 0.5 * B1, L, lone_bandwidth=B1)
check("ring-no-cpu", math.isclose(comm, network) and math.isclose(step, 0.1 + network), (step, comm))

# With the CPU priced: both ranks' 2 n bytes through the switch at 1.5 ns, each rank's reduction
# of half the buffer (1.5 copies a byte) at 0.1 ns, over 2 cores; combined with the network time
# as a p-norm, p = CPU_OVERLAP_P: between the longer of the two and their sum.
cpu = {"cores": 2, "ns_per_byte_link": 1.5, "ns_per_byte_loopback": 0.4, "ns_per_byte_memory": 0.1}
cpu_s = (2 * n * 1.5 + 2 * 1.5 * n / 2 * 0.1) * 1e-9 / 2
p = cm.CPU_OVERLAP_P
_, comm = cm.predict(0.1, report, 1, 0.5 * B1, L, cpu=cpu, lone_bandwidth=B1)
check("ring-with-cpu", math.isclose(comm, (network ** p + cpu_s ** p) ** (1 / p)), (comm, network, cpu_s))
check("between-max-and-sum", max(network, cpu_s) < comm < network + cpu_s, comm)

# validate.py --passes: a job's compute, step time and probes are the medians over the passes, each
# pass's figures kept; one pass is its own rows.
import validate  # noqa: E402

probes = {key: 1.0 for key in validate.PROBED}
passes = [[dict(probes, compute_ms=c, measured_ms=m, measured_runs_ms=[m], probe_mbit=b)]
          for c, m, b in ((100, 500, 900), (120, 700, 990), (110, 400, 950))]
row = validate.combine(passes)[0]
check("passes-medians", (row["compute_ms"], row["measured_ms"], row["probe_mbit"]) == (110, 500, 950), row)
check("passes-kept", row["pass_measured_ms"] == [500, 700, 400] and row["measured_runs_ms"] == [500, 700, 400]
      and row["pass_probes"]["probe_mbit"] == [900, 990, 950], row)
check("one-pass", validate.combine(passes[:1]) == passes[0])

check.finish()
