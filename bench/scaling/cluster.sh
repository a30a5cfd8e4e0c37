#!/bin/bash
# A simulated cluster on this machine: H hosts, each a network namespace
# (ddpsim0, ddpsim1, ...) with one interface, sim0, at 10.77.0.<i+1>,
# joined by ddp_netsim's switch with links of a given bandwidth and latency
# (bench/scaling/README.md). Needs root.
#
#   cluster.sh up NETSIM HOSTS RATE_MBIT LATENCY_US   start it (after a down)
#   cluster.sh down                                   stop the switch, remove the namespaces
#   cluster.sh exec I COMMAND...                      run COMMAND on host I
set -euo pipefail
readonly state=${DDP_SIM_STATE:-/tmp/ddp_netsim}
readonly mtu=${DDP_SIM_MTU:-64000}

down() {
  if [[ -f $state/pid ]]; then
    kill "$(cat "$state/pid")" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$(cat "$state/pid")" 2>/dev/null || break
      sleep 0.1
    done
  fi
  for ns in $(ip netns list | awk '/^ddpsim[0-9]+/ {print $1}'); do
    ip netns del "$ns"
  done
  rm -rf "$state"
}

case ${1:-} in
  up)
    [[ $# -eq 5 ]] || { echo "usage: $0 up NETSIM HOSTS RATE_MBIT LATENCY_US" >&2; exit 2; }
    netsim=$2 hosts=$3 rate=$4 latency=$5
    down
    mkdir -p "$state"
    names=""
    for ((i = 0; i < hosts; i++)); do
      ip netns add "ddpsim$i"
      ip -n "ddpsim$i" link set lo up
      names+="${names:+,}ddpsim$i"
    done
    "$netsim" --netns "$names" --rate-mbit "$rate" --latency-us "$latency" --ready-file "$state/ready" \
      >"$state/netsim.log" 2>&1 &
    echo $! >"$state/pid"
    for _ in $(seq 100); do
      [[ -f $state/ready ]] && break
      sleep 0.05
    done
    [[ -f $state/ready ]] || { cat "$state/netsim.log"; echo "cluster.sh: the switch did not start" >&2; exit 1; }
    for ((i = 0; i < hosts; i++)); do
      ip -n "ddpsim$i" link set sim0 mtu "$mtu" up
      ip -n "ddpsim$i" addr add "10.77.0.$((i + 1))/24" dev sim0
    done
    echo "cluster.sh: $hosts hosts (10.77.0.1 to 10.77.0.$hosts), links of $rate Mbit/s and $latency us"
    ;;
  down) down ;;
  exec)
    [[ $# -ge 3 ]] || { echo "usage: $0 exec I COMMAND..." >&2; exit 2; }
    host=$2
    shift 2
    exec ip netns exec "ddpsim$host" "$@"
    ;;
  *) echo "usage: $0 up NETSIM HOSTS RATE_MBIT LATENCY_US | down | exec I COMMAND..." >&2; exit 2 ;;
esac
