#!/usr/bin/env bash
# Two hosts joined by a slow, lossy link (docs/reliability.md, "Network
# faults"). Each host is a network namespace; link.py carries the frames
# between them (this kernel has no netem). 2 hosts x 2 ranks, one ddprun per
# host (--nnodes 2), rank 0's store on host A. Needs root, ip.
#   clean       mnist_train over the link with no delay and no loss: the
#               reference checksum and time;
#   slow-lossy  the same with 50 ms each way and 1% of the frames dropped:
#               it trains, slower, to the same parameters bit for bit;
#   link-down   flight_recorder_main looping allreduces (group timeout 5 s);
#               host B's end of the link is taken down mid-step: every rank
#               ends with an error that names a rank of the other host (host
#               B's ranks from their own silent connections), and both
#               ddpruns end within 60 s.
# Usage: netem_cases.sh <ddprun> <mnist_train> <flight_recorder_main> <python3>
# Prints "netem_cases: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../testing/checks.sh"
. "$here/../../testing/until_line.sh"
ddprun=$1
mnist=$2
looper=$3
python=$4
ns=ddpnet$$
subnet=10.234.$(($$ % 250))
port=$((21000 + $$ % 20000))
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-netem.XXXXXX")
link_pid=
cleanup() {
  [[ -n $link_pid ]] && kill "$link_pid" 2>/dev/null && wait "$link_pid" 2>/dev/null
  ip netns del "${ns}A" 2>/dev/null
  ip netns del "${ns}B" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# link <delay ms> <loss>: (re)makes both hosts and the link between them.
link() {
  [[ -n $link_pid ]] && kill "$link_pid" 2>/dev/null && wait "$link_pid" 2>/dev/null
  ip netns del "${ns}A" 2>/dev/null
  ip netns del "${ns}B" 2>/dev/null
  ip netns add "${ns}A" && ip netns add "${ns}B" || { echo "netem_cases: FAILED: cannot make namespaces (root?)"; exit 1; }
  rm -f "$work/ready"
  "$python" "$here/link.py" --namespaces "${ns}A,${ns}B" --subnet "$subnet" --delay-ms "$1" --loss "$2" \
    --seed 5 --ready "$work/ready" >>"$work/link.log" 2>&1 &
  link_pid=$!
  until_line "$work/ready" '^up$' 10 || { cat "$work/link.log"; exit 1; }
}

# on_hosts <case> <program> <args...>: one ddprun per host, in the
# background; sets $pa $pb and $dir.
on_hosts() {
  dir=$work/$1
  mkdir -p "$dir"
  shift
  port=$((port + 1))
  local host node=0
  for host in A B; do
    ip netns exec "${ns}$host" env DDP_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 DDP_FLIGHT_RECORDER_DIR="$dir/fr" \
      "$ddprun" --nnodes 2 --node-rank $node --nproc-per-node 2 --master-addr "$subnet.1" --master-port $port \
      "$@" >"$dir/$host.log" 2>&1 &
    eval "p$host=\$!"
    node=$((node + 1))
  done
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
checksum() { sed -n 's/.*final parameters: checksum \([0-9a-f]*\) .*/\1/p' "$1"; }

train=(--epochs 2 --train-size 1200 --test-size 200 --lr 0.03)

# clean
link 0 0
start=$(date +%s.%N)
on_hosts clean "$mnist" "${train[@]}"
wait $pA; rcA=$?; wait $pB; rcB=$?
clean_s=$(since "$start")
clean=$(checksum "$dir/A.log")
check clean test $rcA = 0 -a $rcB = 0 -a -n "$clean"
echo "netem_cases: clean link: checksum $clean in ${clean_s} s"

# slow-lossy
link 50 0.01
start=$(date +%s.%N)
on_hosts slow-lossy "$mnist" "${train[@]}"
wait $pA; rcA=$?; wait $pB; rcB=$?
slow_s=$(since "$start")
slow=$(checksum "$dir/A.log")
check slow-lossy-trains test $rcA = 0 -a $rcB = 0
check slow-lossy-same-parameters test -n "$slow" -a "$slow" = "$clean"
check slow-lossy-slower awk -v s="$slow_s" -v c="$clean_s" 'BEGIN { exit !(s > c) }'
echo "netem_cases: 50 ms, 1% loss: checksum $slow in ${slow_s} s ($(awk -v s="$slow_s" -v c="$clean_s" 'BEGIN { printf "%.1f", s / c }')x the clean link)"
kill "$link_pid"; wait "$link_pid"; link_pid=
sed -n 's/^/netem_cases: /p' "$work/link.log" | tail -1

# link-down
link 0 0
on_hosts link-down "$looper" loop 5
for r in 0 1; do until_line "$dir/A.log" "^\[rank $r\]: flight_recorder: rank $r looping" 60; done
for r in 2 3; do until_line "$dir/B.log" "^\[rank $r\]: flight_recorder: rank $r looping" 60; done
sleep 1
ip -n "${ns}B" link set eth0 down
down=$(date +%s)
( sleep 60; kill -9 $pA $pB 2>/dev/null ) & guard=$!
wait $pA; wait $pB
kill $guard 2>/dev/null
ended=$(( $(date +%s) - down ))
check link-down-ends test $ended -lt 60
echo "netem_cases: link down: both hosts' ranks ended ${ended} s after it"
for r in 0 1 2 3; do
  host=$([[ $r -lt 2 ]] && echo A || echo B)
  line=$(grep -E "^\[rank $r\]: flight_recorder: rank $r caught: " "$dir/$host.log" | head -1)
  echo "netem_cases: $line"
  # Host A's ranks learn it from the store (on host A); host B's, cut off
  # from the store too, from their own connections (Note [Silent peers]).
  if [[ $host = A ]]; then others='rank(\(s\) \[| )[23]'; else others='connections to rank\(s\) \[[01]'; fi
  check "link-down-rank-$r-names-the-other-host" grep -qE "$others" <<<"$line"
done
checks_summary netem_cases
