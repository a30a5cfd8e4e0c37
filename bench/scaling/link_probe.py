#!/usr/bin/env python3
"""What a simulated link delivers (bench/scaling/): one-way latency from 200
one-byte round trips, bandwidth from sending MIB mebibytes over one TCP
connection, and the machine's CPU time per byte sent (every core's busy
time, from /proc/stat, over the transfer: the sender's and receiver's
kernels, the switch). `link_probe.py server` on one host, `link_probe.py
client ADDR MIB` on another (or on the same host, for loopback); the client
prints `link_probe rtt_us=... mbit_s=... cpu_ns_per_byte=...`. `link_probe.py
memory` prints the CPU time per byte of a memory copy."""
import os
import socket
import sys
import time

PORT = 5555


def server():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", PORT))
    listener.listen(1)
    listener.settimeout(60)
    conn, _ = listener.accept()
    conn.settimeout(120)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(200):
        conn.sendall(conn.recv(1))
    while conn.recv(1 << 20):
        pass
    conn.sendall(b"k")


def busy_seconds():
    """Every core's busy time since boot, in seconds (/proc/stat's first line)."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def memory_ns_per_byte(mib=64, repeats=10):
    """This machine's CPU time per byte of a memory copy (the fastest of `repeats` copies of
    `mib` MiB, one core, the machine idle): what the collectives' own copies and reductions cost
    per byte in cost_model.py."""
    source = bytearray(b"\1" * (mib << 20))
    target = bytearray(len(source))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target[:] = source
        best = min(best, time.perf_counter() - start)
    return best * 1e9 / len(source)


def client(address, mib):
    deadline = time.time() + 30
    while True:
        try:
            conn = socket.create_connection((address, PORT), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.settimeout(120)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    for _ in range(200):
        conn.sendall(b"x")
        conn.recv(1)
    rtt = (time.perf_counter() - start) / 200
    block = b"y" * (1 << 20)
    busy = busy_seconds()
    start = time.perf_counter()
    for _ in range(mib):
        conn.sendall(block)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    seconds = time.perf_counter() - start
    cpu = busy_seconds() - busy
    print(f"link_probe rtt_us={rtt * 1e6:.1f} mbit_s={mib * 8 * 1.048576 / seconds:.1f} "
          f"cpu_ns_per_byte={cpu * 1e9 / (mib << 20):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server()
    elif sys.argv[1] == "memory":
        print(f"link_probe memory_ns_per_byte={memory_ns_per_byte():.4f}")
    else:
        client(sys.argv[2], int(sys.argv[3]))
