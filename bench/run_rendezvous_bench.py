"""Rendezvous at scale: W simulated ranks (bench/rendezvous_bench.cpp, one
thread and one store client each) do init_process_group()'s store steps
against ddp's TCPStore server and against PyTorch's (torch.distributed.TCPStore
with its libuv server, the one torchrun's agent serves), and this prints the
time to complete and each server's CPU time and memory, with the ratio.

Usage (any python3; it builds nothing):
  python3 bench/run_rendezvous_bench.py [BUILD_DIR] [--worlds 256,1024]
      [--rounds R] [--hostile N] [--python PATH]
BUILD_DIR (default: build) must hold bench/rendezvous_bench. --python is
PyTorch's side (default: the torch 2.11 venv that scripts/compat.sh keeps in
~/.cache/ddp, when it exists; else /usr/bin/python3).

Each server runs in a process of its own, started fresh for each world size;
its CPU time is its user + system time over the rounds (from /proc), its
memory the growth of its peak resident set over what it held when it
started serving. The clients are the same program for both servers (ddp's
clients of each protocol), so the difference is the server's. The time is
the lowest of the rounds (other processes only ever add time). --hostile N
adds N hostile clients (garbage, an oversized claim on ddp's server, slow
loris, silent) for the whole rendezvous. Exits 0 whatever the figures, 1 if
a side fails.

Both run in a network namespace of their own, with only loopback, when the
driver can make one (root and `unshare`; it says so otherwise): PyTorch
2.11's server looks up each client's host name when it accepts it, and
where the DNS server is unreachable (this project's build machine outside
a namespace) each lookup waits for the resolver's 5 s timeout, so that 256
ranks took 40 s; in the namespace the lookup fails at once, as a working
DNS answers at once on a real cluster. ddp's server looks nothing up.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

import bench_common

DRIVER = "run_rendezvous_bench.py"
LINE = re.compile(r"^rendezvous_bench (server=.*)$")

# PyTorch's server: prints its port, then serves until stdin closes.
TORCH_SERVER = """
import sys, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
print("port", store.port, flush=True)
sys.stdin.read()
"""


def proc_figures(pid):
    """(CPU seconds, peak RSS in KiB, RSS in KiB) of process `pid`."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    status = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return cpu, int(status["VmHWM"].split()[0]), int(status["VmRSS"].split()[0])


def start_server(side, bench, python):
    command = [bench, "serve"] if side == "ddp" else [python, "-c", TORCH_SERVER]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              universal_newlines=True)
    line = server.stdout.readline().split()
    if len(line) != 2 or line[0] != "port":
        server.kill()
        sys.exit("%s: the %s server did not say its port" % (DRIVER, side))
    return server, int(line[1])


def run_side(side, bench, python, world, rounds, hostile):
    server, port = start_server(side, bench, python)
    try:
        cpu0, _, rss0 = proc_figures(server.pid)
        best = None
        for _ in range(rounds):
            proc = subprocess.run(
                [bench, "clients", "--port", str(port), "--world", str(world), "--server", side,
                 "--hostile", str(hostile)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
            found = [LINE.match(line) for line in proc.stdout.splitlines()]
            found = [m.group(1) for m in found if m]
            if proc.returncode != 0 or not found:
                sys.stderr.write(proc.stderr[-3000:])
                sys.exit("%s: %s's side failed at world %d (exit code %d)"
                         % (DRIVER, side, world, proc.returncode))
            fields = dict(kv.split("=", 1) for kv in found[0].split())
            if best is None or float(fields["total_s"]) < float(best["total_s"]):
                best = fields
        cpu1, peak, _ = proc_figures(server.pid)
        best["server_cpu_s"] = "%.3f" % (cpu1 - cpu0)
        best["server_mem_mb"] = "%.1f" % ((peak - rss0) / 1024.0)
        return best
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def in_own_network_namespace():
    """Re-runs this driver in a new network namespace with loopback up, when
    it can (see the top); returns False when it cannot, to go on here."""
    if os.environ.get("DDP_BENCH_NETNS") == "1":
        return False
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        print("# not in a network namespace of its own (needs root, unshare and ip): PyTorch's "
              "server may wait on DNS for each client")
        return False
    env = dict(os.environ, DDP_BENCH_NETNS="1")
    command = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
               sys.executable] + sys.argv
    sys.exit(subprocess.call(command, env=env))


def main():
    in_own_network_namespace()
    parser = argparse.ArgumentParser(description="Rendezvous at scale: ddp's store server against PyTorch's.")
    bench_common.add_common_arguments(parser, ["bench/rendezvous_bench"],
                                      "rendezvous per world size and server (default 2)")
    parser.add_argument("--worlds", default="256,1024", help="world sizes (default 256,1024)")
    parser.add_argument("--hostile", type=int, default=0, help="hostile clients beside the ranks (default 0)")
    args = parser.parse_args()
    bench_common.check_rounds(parser, args)
    (bench,) = bench_common.built_programs(DRIVER, args.build_dir, ["bench/rendezvous_bench"])[1:]
    worlds = [int(w) for w in args.worlds.split(",")]
    load_before = bench_common.load_average()
    print("# rendezvous_bench: worlds %s, %d rounds, %d hostile clients; PyTorch %s (%s)%s"
          % (args.worlds, args.rounds, args.hostile, bench_common.torch_version(args.python), args.python,
             "; in a network namespace of its own" if os.environ.get("DDP_BENCH_NETNS") == "1" else ""))
    rows = []
    for world in worlds:
        figures = {}
        for side in ("ddp", "torch"):
            figures[side] = run_side(side, bench, args.python, world, args.rounds, args.hostile)
            print("rendezvous_bench " + " ".join("%s=%s" % kv for kv in figures[side].items()))
            sys.stdout.flush()
        ratio = float(figures["ddp"]["total_s"]) / max(float(figures["torch"]["total_s"]), 1e-9)
        rows.append([str(world), figures["ddp"]["total_s"], figures["torch"]["total_s"], "%.2f" % ratio,
                     figures["ddp"]["server_cpu_s"], figures["torch"]["server_cpu_s"],
                     figures["ddp"]["server_mem_mb"], figures["torch"]["server_mem_mb"]])
    bench_common.print_table(["world", "ddp s", "PyTorch s", "ratio", "ddp server CPU s",
                              "PyTorch server CPU s", "ddp server MB", "PyTorch server MB"], rows)
    bench_common.warn_if_busy(load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
