#!/usr/bin/env bash
# mnist_train under torchrun's elastic agent, two agents ("nodes") of one
# worker each with the c10d rendezvous, --nnodes 1:2, on this machine
# (docs/launcher.md, "torchrun, elastic"). Usage:
#   torchrun_elastic.sh <mnist_train> <ddprun> <python> [torchrun...]
# (the torchrun command as run_torchrun_test.sh picks it; DDP_TEST_TORCHRUN
# in the environment replaces it). Every worker runs
#   mnist_train --train-size 2000 --epochs 4 --resume --checkpoint-dir <shared directory>
# (--resume: a worker that torchrun restarts for a membership change gets
# TORCHELASTIC_RESTART_COUNT=0, and must resume all the same).
#   node-lost      both nodes train; node B is SIGKILLed with its worker
#                  after epoch 1: A's worker fails on the lost peer, A
#                  restarts it alone (world size 1), and it resumes from
#                  the newest checkpoint and finishes
#   node-joins     A trains alone (world size 1); B joins after epoch 1: A
#                  restarts its worker, and both resume at world size 2.
#                  With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on both agents:
#                  PyTorch 2.x's agent otherwise keeps round 0's bootstrap
#                  (MASTER_ADDR) for later rounds, and a node that joins
#                  waits for a MASTER_ADDR key of the new round that nobody
#                  writes (dynamic_rendezvous.py, _bootstrap_store_info), for
#                  any program; ddp's rank 0 then serves its own store.
#   max-restarts   both nodes, --max-restarts 1; rank 1 SIGKILLs itself in
#                  epoch 2 of the first attempt (MNIST_TRAIN_TEST_CRASH):
#                  both agents restart their workers, which resume from
#                  epoch 1's checkpoint and end with the parameters of an
#                  uninterrupted 2-rank run (ddprun), checksum for checksum
# The agents use --rdzv_conf keep_alive_interval=1,keep_alive_max_attempt=3:
# a lost node is noticed in ~3 s instead of the default 15 s. Prints
# "torchrun_elastic: N of N checks passed" at the end; exits 77 (skipped)
# when the launcher cannot run. ELASTIC_KEEP=1 keeps the agents' logs (the
# directory is printed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/free_port.sh"
. "$here/../testing/checks.sh"
. "$here/../testing/until_line.sh"
mnist_train=$1
ddprun=$2
python=$3
shift 3
if [[ -n ${DDP_TEST_TORCHRUN:-} ]]; then
  set -- "$DDP_TEST_TORCHRUN"
elif [[ $# -eq 0 ]]; then
  set -- "$python" -m torch.distributed.run
fi
torchrun=("$@")
if ! help=$("${torchrun[@]}" --help 2>&1); then
  echo "skipped: '${torchrun[*]}' cannot run (no PyTorch with torch.distributed.run?)"
  exit 77
fi
# PyTorch 1.x's launcher knows only underscores, and on Python 3.11 needs
# parsable --redirects/--tee (run_torchrun_test.sh says why).
if ! grep -q -- --nproc-per-node <<<"$help"; then
  torchrun+=(--redirects 2 --tee 2)
fi
echo "torchrun_elastic: launcher: ${torchrun[*]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-elastic.XXXXXX")
[[ -z ${ELASTIC_KEEP:-} ]] || echo "torchrun_elastic: logs in $work"
# Agents run in their own sessions (setsid): stop each whole session.
agents=()
stop_all() {
  local pid
  for pid in "${agents[@]}"; do
    kill -9 $(pgrep -P "$pid") 2>/dev/null # the worker, in a session of its own
    kill -9 -- -"$pid" 2>/dev/null
  done
}
trap 'stop_all; [[ -n ${ELASTIC_KEEP:-} ]] || rm -rf "$work"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_BACKEND
export OMP_NUM_THREADS=1

train=(--train-size 2000 --epochs 4 --resume)
# agent <case> <A|B> [torchrun flags...]: starts one agent of the case's
# job in the background, in its own session; its pid in $agent_pid. A hosts
# the rendezvous store (is_host=true), B only connects to it (is_host=false,
# as on another machine): the job cannot outlive the host's agent, and with
# both on one machine whichever bound the port first would be the host.
agent() {
  local name=$1 node=$2 host=false
  shift 2
  [[ $node == A ]] && host=true
  setsid "${torchrun[@]}" --nnodes 1:2 --nproc_per_node 1 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "$name" --monitor_interval 0.5 \
    --rdzv_conf is_host=$host,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3 "$@" \
    --no_python "$mnist_train" "${train[@]}" --checkpoint-dir "$work/$name-ckpt" \
    >"$work/$name-$node.log" 2>&1 &
  agent_pid=$!
  agents+=("$agent_pid")
}
# finish <pid> <seconds>: waits for an agent to exit (killing it after the
# time); its exit code in $rc.
finish() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 -- -"$1" 2>/dev/null
  wait "$1"
  rc=$?
}
count() { grep -cE "$2" "$1"; }
case_start=$SECONDS
took() { # <case>: how long it took, for the log
  echo "torchrun_elastic: $1 took $((SECONDS - case_start)) s"
  case_start=$SECONDS
}
show() {
  grep -vE '^epoch [0-9]+/[0-9]+ +step |^\[?[IW][0-9]{4} ' "$work/$1.log" | sed "s/^/  $1: /"
}
# both_end <case>: waits for the case's agents $a and $b (A's exit code in
# $rc_a, B's in $rc), then shows both logs.
both_end() {
  finish "$a" 120
  rc_a=$rc
  finish "$b" 60
  took "$1"
  show "$1-A"
  show "$1-B"
}
# in_both <case> <regex>: lines of either agent's log that match.
in_both() { cat "$work/$1"-?.log | grep -cE "$2"; }

# ---- node-lost --------------------------------------------------------------------------
port=$(free_port "$python")
agent node-lost A --max_restarts 3
a=$agent_pid
agent node-lost B --max_restarts 3
b=$agent_pid
until_line "$work/node-lost-A.log" '^mnist_train: 2 ranks on' 60 &&
  until_line "$work/node-lost-A.log" '^epoch 1/4: ' 60
# The worker runs in a session of its own (torchrun starts it so): kill it
# and its agent, as a machine that goes away would.
b_worker=$(pgrep -P "$b")
kill -9 -- -"$b" $b_worker
wait "$b" 2>/dev/null
finish "$a" 120
took node-lost
show node-lost-A
check "node-lost: B lost with its worker; A's worker names the lost rank, A restarts it alone and it resumes" \
  test $rc = 0 -a "$(count "$work/node-lost-A.log" 'lost (connection to )?rank 1')" -ge 1 \
  -a "$(count "$work/node-lost-A.log" '^mnist_train: 1 rank on cpu')" = 1 \
  -a "$(count "$work/node-lost-A.log" '^mnist_train: note: the checkpoint was made with 2 ranks, batch 64, seed 1; this run has 1 ranks')" = 1 \
  -a "$(count "$work/node-lost-A.log" '^mnist_train: resumed from .*/epoch-[123]\.pt: [123] of 4 epochs done$')" = 1 \
  -a "$(count "$work/node-lost-A.log" '^final parameters: checksum [0-9a-f]+ \(21840 values\); they agree across 1 rank ')" = 1

# ---- node-joins -------------------------------------------------------------------------
port=$(free_port "$python")
train=(--train-size 2000 --epochs 10 --resume)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
agent node-joins A --max_restarts 3
a=$agent_pid
until_line "$work/node-joins-A.log" '^epoch 1/10: ' 60
agent node-joins B --max_restarts 3
b=$agent_pid
unset TORCH_DISABLE_SHARE_RDZV_TCP_STORE
both_end node-joins
check "node-joins: A trains alone; B joins; both resume at world size 2 and finish" \
  test $rc_a = 0 -a $rc = 0 -a "$(count "$work/node-joins-A.log" '^mnist_train: 1 rank on cpu')" = 1 \
  -a "$(in_both node-joins '^mnist_train: 2 ranks on cpu')" = 1 \
  -a "$(in_both node-joins '^mnist_train: note: the checkpoint was made with 1 ranks, batch 64, seed 1; this run has 2 ranks')" = 1 \
  -a "$(in_both node-joins '^final parameters: checksum [0-9a-f]+ \(21840 values\); they agree across 2 ranks ')" = 1

# ---- max-restarts -----------------------------------------------------------------------
train=(--train-size 2000 --epochs 4 --resume)
"$ddprun" --nproc-per-node 2 "$mnist_train" "${train[@]}" --checkpoint-dir "$work/uninterrupted-ckpt" \
  >"$work/uninterrupted.log" 2>&1
took uninterrupted
final=$(sed -nE 's/^\[rank 0\]: (final parameters: checksum [0-9a-f]+ .*)$/\1/p' "$work/uninterrupted.log")
port=$(free_port "$python")
export MNIST_TRAIN_TEST_CRASH=1:2:5
agent max-restarts A --max_restarts 1
a=$agent_pid
agent max-restarts B --max_restarts 1
b=$agent_pid
unset MNIST_TRAIN_TEST_CRASH
both_end max-restarts
check "max-restarts: a worker's crash restarts both nodes' workers, which resume to the uninterrupted run's parameters" \
  test -n "$final" -a $rc_a = 0 -a $rc = 0 \
  -a "$(in_both max-restarts '^mnist_train: rank 1 kills itself after epoch 2 step 5')" = 1 \
  -a "$(in_both max-restarts '^mnist_train: the launcher restarted the job \(restart 1\): resuming from the newest checkpoint')" = 1 \
  -a "$(in_both max-restarts '^mnist_train: resumed from .*/epoch-1\.pt: 1 of 4 epochs done$')" = 1 \
  -a "$(cat "$work"/max-restarts-?.log | grep -cF "$final")" = 1

checks_summary torchrun_elastic
