#!/usr/bin/env bash
# Gloo's buffers in shared memory across hosts: hosts made of network
# namespaces (a bridge in this namespace, a veth pair into each), ranks
# started in them with nsenter. Ranks in different network namespaces are
# different hosts to ddp (Note [Shared buffers]).
#   2 + 2 ranks: each host's ranks share buffers, the hosts reduce over TCP;
#   2 + 2 + 2 ranks: the same, the hosts' reduction a reduce-scatter and an
#     all-gather (Note [Reduced among hosts]);
#   2 + 1 ranks: uneven hosts, every buffer private, every byte over TCP.
# Each layout's ranks check their results (shm_hosts_main.cpp). Needs root
# (CI runs as root), ip, nsenter.
# Usage: shm_hosts.sh <shm_hosts_main>
set -u
main=$1
ns=ddpshm$$
subnet=10.232.$(($$ % 250))
port=$((20000 + $$ % 20000))
status=0

cleanup() {
  for n in 1 2 3; do ip netns del "${ns}n$n" 2>/dev/null; done
  ip link del "${ns}br" 2>/dev/null
}
trap cleanup EXIT

for tool in ip nsenter; do
  command -v "$tool" >/dev/null || { echo "shm_hosts.sh: FAILED: $tool not found (Debian: iproute2, util-linux)"; exit 1; }
done
ip link add "${ns}br" type bridge && ip link set "${ns}br" up || { echo "shm_hosts.sh: FAILED: cannot make a bridge (root?)"; exit 1; }
for n in 1 2 3; do
  ip netns add "${ns}n$n" &&
    ip link add "${ns}v$n" type veth peer name eth0 netns "${ns}n$n" &&
    ip link set "${ns}v$n" master "${ns}br" &&
    ip link set "${ns}v$n" up &&
    ip -n "${ns}n$n" addr add "$subnet.$n/24" dev eth0 &&
    ip -n "${ns}n$n" link set eth0 up &&
    ip -n "${ns}n$n" link set lo up || { echo "shm_hosts.sh: FAILED: cannot make host $n"; exit 1; }
done

# run_layout <expect> <host of rank 0> <host of rank 1> ...
run_layout() {
  local expect=$1
  shift
  local world=$# rank=0 host pids=() rc
  port=$((port + 1))
  for host in "$@"; do
    nsenter --net="/var/run/netns/${ns}n$host" env RANK=$rank WORLD_SIZE=$world \
      MASTER_ADDR="$subnet.1" MASTER_PORT=$port DDP_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      timeout 120 "$main" "$expect" &
    pids+=($!)
    rank=$((rank + 1))
  done
  for pid in "${pids[@]}"; do
    wait "$pid"
    rc=$?
    if [ "$rc" != 0 ]; then
      echo "shm_hosts.sh: FAILED: a rank of layout [$*] ($expect) exited with $rc"
      status=1
    fi
  done
  echo "shm_hosts.sh: layout hosts [$*] ($expect): done"
}

run_layout shared 1 1 2 2
run_layout shared 1 2 1 2
run_layout shared 1 1 2 2 3 3
run_layout shared 1 3 2 2 3 1
run_layout private 1 1 2
[ "$status" = 0 ] && echo "shm_hosts.sh: all layouts passed"
exit $status
