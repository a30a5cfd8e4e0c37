#!/usr/bin/env python3
"""A network link with delay and loss between two network namespaces.

This machine's kernel has no netem queueing discipline (`tc qdisc add ...
netem` says "Specified qdisc kind is unknown"), so the link is emulated in
user space: a TAP device in each namespace (named eth0 there, with address
SUBNET.1 and SUBNET.2), and this process carrying every Ethernet frame from
one to the other after --delay-ms, dropping each with probability --loss
(drawn from --seed). TCP between the namespaces then meets the delay and the
loss as it would on a real link; `ip -n NS link set eth0 down` takes the
link down on one side.

  link.py --namespaces hostA,hostB --subnet 10.233.7 --delay-ms 50 --loss 0.01 --ready FILE

Writes FILE once both ends are up, then forwards until SIGTERM or SIGINT,
and prints how many frames it carried and dropped. Needs root.
"""

import argparse
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def make_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def ip(*words):
    subprocess.run(["ip", *words], check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", required=True, help="two network namespaces, comma-separated")
    parser.add_argument("--subnet", required=True, help="the first three numbers of the /24, e.g. 10.233.7")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of every frame")
    parser.add_argument("--loss", type=float, default=0.0, help="probability that a frame is dropped")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ready", help="a file to write once the link is up")
    args = parser.parse_args()
    namespaces = args.namespaces.split(",")
    if len(namespaces) != 2:
        sys.exit("link.py: --namespaces needs exactly two names")

    taps = []
    for index, ns in enumerate(namespaces):
        name = f"ddpl{os.getpid() % 100000}{index}"
        fd = make_tap(name)
        ip("link", "set", name, "netns", ns)
        ip("-n", ns, "link", "set", name, "name", "eth0")
        ip("-n", ns, "addr", "add", f"{args.subnet}.{index + 1}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        os.set_blocking(fd, False)
        taps.append(fd)
    other = {taps[0]: taps[1], taps[1]: taps[0]}

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    if args.ready:
        with open(args.ready, "w") as f:
            f.write("up\n")

    rng = random.Random(args.seed)
    delay = args.delay_ms / 1000.0
    queue = []  # (due, sequence, fd, frame)
    sequence = carried = dropped = 0
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, fd, frame = heapq.heappop(queue)
            try:
                os.write(fd, frame)
                carried += 1
            except OSError:
                dropped += 1  # that end is down
        wait = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            readable, _, _ = select.select(taps, [], [], wait)
        except InterruptedError:
            continue
        for fd in readable:
            while True:
                try:
                    frame = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if rng.random() < args.loss:
                    dropped += 1
                    continue
                sequence += 1
                heapq.heappush(queue, (time.monotonic() + delay, sequence, other[fd], frame))
    print(f"link.py: {carried} frames carried, {dropped} dropped", flush=True)


if __name__ == "__main__":
    main()
