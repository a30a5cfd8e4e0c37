#!/usr/bin/env bash
# ddp programs under a real Slurm (Debian's slurmctld, slurmd and munge on
# this machine, started and stopped here: slurm_cluster.sh), as a cluster
# user starts them (docs/launcher.md, "Slurm"). Usage:
#   slurm_cases.sh <toy_model> <mnist_train> <python3> <mpirun>
# Each case checks the ranks and local ranks that the programs print
# ("toy_model: rank R of 2 (local rank L of 2) ... backend B") and that the
# ranks agreed, or the error they stop with:
#   srun-gloo         srun -n2, no MASTER_*: derived from the job
#   srun-pmix-mpi     srun -n2 --mpi=pmix, DDP_BACKEND=mpi
#   srun-pmi2-mpi     srun -n2 --mpi=pmi2, DDP_BACKEND=mpi: Debian's Open MPI
#                     cannot start; ddp's warning says to use --mpi=pmix
#   sbatch-exported   sbatch -n2, a script that exports MASTER_* and runs srun
#   sbatch-derived    the same without MASTER_*
#   sbatch-no-srun    the script runs the program itself (no srun): it stops
#                     at once saying how to start ranks, instead of waiting
#   salloc-mpirun-mpi, salloc-mpirun-gloo, sbatch-mpirun-mpi,
#   sbatch-mpirun-gloo  mpirun -np 2 inside an allocation: Open MPI's ranks,
#                     not the allocation's (Gloo with MASTER_* exported)
#   salloc-mpirun-gloo-unset  the same without MASTER_*: the error says
#                     what to export
#   killed-rank       rank 1 of mnist_train SIGKILLed mid-epoch: rank 0
#                     stops within 15 s naming the lost rank, srun fails
#   no-kill-on-exit   rank 1 exits before it joins: without srun -K, rank 0
#                     says every second that it waits for rank 1
#   kill-on-exit      the same with srun -K: srun stops rank 0 at once
#   requeue           sbatch --requeue, scontrol requeue mid-run: the job
#                     starts again (SLURM_RESTART_COUNT=1), resumes from its
#                     newest checkpoint, and ends with the parameters of an
#                     uninterrupted run (the same checksum)
# Then on two nodes, each slurmd in its own network and mount namespace
# (slurm_cluster.sh), 2 tasks each; the checkpoint of toy_model in a shared
# directory (TMPDIR), as on a cluster's shared file system:
#   nodes-srun-gloo   srun -N2 -n4: ranks 0-3, local ranks 0-1 on each node,
#                     MASTER_ADDR derived (n1)
#   nodes-sbatch-derived  the same from an sbatch -N2 -n4 script
#   nodes-srun-mpi    srun -N2 -n4 --mpi=pmix, DDP_BACKEND=mpi
#   nodes-sbatch-mpirun-mpi  mpirun -np 4 in an sbatch -N2 -n4 script
# (Open MPI's TCP transport is told the nodes' subnet: it otherwise tries
# this machine's other interfaces first.) Where no namespace can be made
# (slurm_netns_missing), the test says so and runs the one-node cases only.
# Prints "slurm_cases: N of N checks passed" at the end (checks.sh). Exits
# 77 (skipped) only where no Slurm can start (slurm_missing says why).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../testing/free_port.sh"
. "$here/../../testing/checks.sh"
. "$here/../../testing/until_line.sh"
. "$here/slurm_cluster.sh"
toy_model=$1
mnist_train=$2
python=$3
mpirun=$4

why=$(slurm_missing)
if [[ -n $why ]]; then
  echo "skipped: no Slurm cluster can start here: $why"
  exit 77
fi
# In the current directory (CTest's: the build tree), not under /tmp, which
# the two-node cluster's nodes each replace with their own.
work=$(mktemp -d "$PWD/slurm-cases.XXXXXX")
chmod 755 "$work" # munged's socket directory must be searchable by all
trap 'kill -9 $(jobs -p) 2>/dev/null; slurm_stop; rm -rf "$work"' EXIT
# start <nodes>: a cluster of that many nodes in $work/cluster-<nodes>.
start() {
  local started
  started=$(date +%s.%N)
  slurm_start "$work/cluster-$1" "$python" "$1" || exit 1
  echo "slurm_cases: Slurm $(sinfo -V | cut -d' ' -f2), $1 node(s) up in $("$python" -c "import time; print(f'{time.time() - $started:.1f}')") s ($SLURM_CONF)"
}
start 1

# What the ranks must not inherit from the shell that runs the test.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_BACKEND \
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1

# show <case>: the case's output, indented, for the log.
show() {
  sed "s/^/  $1: /" "$work/$1.log"
}
# count <case> <regex>: lines of its output that match.
count() {
  grep -cE "$2" "$work/$1.log"
}
# two_ranks <case> <backend>: both ranks of one world of 2, each with its
# own local rank, trained and agreed.
two_ranks() {
  [ "$(count "$1" "^toy_model: rank 0 of 2 \(local rank 0 of 2\) on cpu, backend $2,")" = 1 ] &&
    [ "$(count "$1" "^toy_model: rank 1 of 2 \(local rank 1 of 2\) on cpu, backend $2,")" = 1 ] &&
    [ "$(count "$1" '^checkpoint: parameters agree across 2 ranks \(max difference 0\)$')" = 2 ]
}
# job <case> <sbatch flags...> -- <script lines...>: runs a batch job to its
# end (sbatch --wait, 120 s at most); sets $rc.
job() {
  local name=$1
  shift
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  printf '#!/bin/bash\n' >"$work/$name.sh"
  printf '%s\n' "$@" >>"$work/$name.sh"
  timeout 120 sbatch --wait --quiet "${flags[@]}" -o "$work/$name.log" "$work/$name.sh"
  rc=$?
  show "$name"
}
# step <case> <command...>: runs a command (srun, salloc) to its end, 120 s
# at most; sets $rc.
step() {
  local name=$1
  shift
  timeout 120 "$@" >"$work/$name.log" 2>&1
  rc=$?
  show "$name"
}
now() { date +%s.%N; }
# within <from> <to> <seconds>: to - from < seconds.
within() {
  "$python" -c "import sys; sys.exit(0 if $2 - $1 < $3 else 1)"
}

# ---- srun -----------------------------------------------------------------------------
step srun-gloo srun -n2 "$toy_model"
check "srun-gloo: srun -n2 trains one world of 2 on Gloo, MASTER_* derived" \
  test $rc = 0 -a "$(two_ranks srun-gloo gloo && echo y)" = y

step srun-pmix-mpi env DDP_BACKEND=mpi srun -n2 --mpi=pmix "$toy_model"
check "srun-pmix-mpi: srun --mpi=pmix with DDP_BACKEND=mpi" \
  test $rc = 0 -a "$(two_ranks srun-pmix-mpi mpi && echo y)" = y

step srun-pmi2-mpi env DDP_BACKEND=mpi srun -n2 --mpi=pmi2 "$toy_model"
check "srun-pmi2-mpi: without PMIx, ddp's warning names --mpi=pmix before MPI_Init fails" \
  test $rc != 0 -a "$(count srun-pmi2-mpi 'srun started this task \(SLURM_PROCID=[01]\) without PMIx \(SLURM_MPI_TYPE=pmi2\).*run srun --mpi=pmix')" -ge 1

# ---- sbatch -----------------------------------------------------------------------------
port=$(free_port "$python")
job sbatch-exported -n2 -- "export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port" "srun $toy_model"
check "sbatch-exported: sbatch -n2 with MASTER_* exported, srun in the script" \
  test $rc = 0 -a "$(two_ranks sbatch-exported gloo && echo y)" = y

job sbatch-derived -n2 -- "srun $toy_model"
check "sbatch-derived: sbatch -n2, srun in the script, MASTER_* derived" \
  test $rc = 0 -a "$(two_ranks sbatch-derived gloo && echo y)" = y

t0=$(now)
job sbatch-no-srun -n2 -- "$toy_model"
t1=$(now)
check "sbatch-no-srun: the program run without srun in a 2-task job stops at once, saying how to start ranks" \
  test $rc != 0 -a "$(count sbatch-no-srun "runs in Slurm job [0-9]+ but not in an srun step .*SLURM_NTASKS=2 .*Start the ranks with srun")" = 1 \
  -a "$(within "$t0" "$t1" 20 && echo y)" = y

# ---- mpirun inside an allocation ---------------------------------------------------------
step salloc-mpirun-mpi env DDP_BACKEND=mpi salloc -n2 "$mpirun" -np 2 "$toy_model"
check "salloc-mpirun-mpi: mpirun in salloc -n2, DDP_BACKEND=mpi: Open MPI's ranks and local ranks" \
  test $rc = 0 -a "$(two_ranks salloc-mpirun-mpi mpi && echo y)" = y

port=$(free_port "$python")
step salloc-mpirun-gloo env MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" salloc -n2 "$mpirun" -np 2 "$toy_model"
check "salloc-mpirun-gloo: mpirun in salloc -n2 on Gloo, MASTER_* exported: Open MPI's ranks" \
  test $rc = 0 -a "$(two_ranks salloc-mpirun-gloo gloo && echo y)" = y

step salloc-mpirun-gloo-unset salloc -n2 "$mpirun" -np 2 "$toy_model"
# (The first rank to fail makes mpirun stop the other, which may not have
# printed its message yet.)
check "salloc-mpirun-gloo-unset: without MASTER_*, the ranks say what to export" \
  test $rc != 0 -a "$(count salloc-mpirun-gloo-unset 'MASTER_ADDR is not set .*mpirun in a Slurm allocation: export MASTER_ADDR=\$\(scontrol show hostnames')" -ge 1

job sbatch-mpirun-mpi -n2 -- "DDP_BACKEND=mpi $mpirun -np 2 $toy_model"
check "sbatch-mpirun-mpi: mpirun in an sbatch -n2 script, DDP_BACKEND=mpi" \
  test $rc = 0 -a "$(two_ranks sbatch-mpirun-mpi mpi && echo y)" = y

port=$(free_port "$python")
job sbatch-mpirun-gloo -n2 -- "export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port" "$mpirun -np 2 $toy_model"
check "sbatch-mpirun-gloo: mpirun in an sbatch -n2 script on Gloo (before: both ranks were rank 0)" \
  test $rc = 0 -a "$(two_ranks sbatch-mpirun-gloo gloo && echo y)" = y

# ---- failures ----------------------------------------------------------------------------
# A rank that dies mid-run: its pid (bash execs into the program) in a file.
rank1_pid=$work/rank1.pid
timeout 120 srun -n2 bash -c "[ \"\$SLURM_PROCID\" = 1 ] && echo \$\$ >$rank1_pid; exec $mnist_train --epochs 50" \
  >"$work/killed-rank.log" 2>&1 &
srun_pid=$!
until_line "$work/killed-rank.log" '^epoch 1/50 +step 10/' 60
t0=$(now)
kill -9 "$(cat "$rank1_pid")"
wait $srun_pid
rc=$?
t1=$(now)
show killed-rank
check "killed-rank: rank 1 SIGKILLed mid-epoch; rank 0 stops within 15 s naming rank 1, srun fails" \
  test $rc != 0 -a "$(count killed-rank 'rank 0.*(lost|closed|reset).*rank 1|rank 1.*(lost|closed|reset)')" -ge 1 \
  -a "$(within "$t0" "$t1" 15 && echo y)" = y

# A rank that exits before it joins. Without -K, srun lets rank 0 wait (up to
# its 30-minute rendezvous deadline); it says for whom.
DDP_RENDEZVOUS_PROGRESS_S=1 timeout 120 srun -n2 bash -c "[ \"\$SLURM_PROCID\" = 1 ] && exit 3; exec $toy_model" \
  >"$work/no-kill-on-exit.log" 2>&1 &
srun_pid=$!
until_line "$work/no-kill-on-exit.log" 'init_process_group: waiting for rank 1 to join \(3 s of' 30
kill -0 $srun_pid 2>/dev/null
still_running=$?
kill -TERM $srun_pid
wait $srun_pid
show no-kill-on-exit
check "no-kill-on-exit: rank 1 exited before joining; without srun -K rank 0 waits, saying for whom" \
  test $still_running = 0 -a "$(count no-kill-on-exit '^\[ddp info\] \[rank 0/2\] init_process_group: waiting for rank 1 to join \([123] s of 1800 s\)$')" = 3

t0=$(now)
step kill-on-exit srun -K -n2 bash -c "[ \"\$SLURM_PROCID\" = 1 ] && exit 3; exec $toy_model"
t1=$(now)
check "kill-on-exit: with srun -K, rank 1's exit stops rank 0 at once" \
  test $rc != 0 -a "$(count kill-on-exit 'task 1: Exited with exit code 3')" = 1 \
  -a "$(count kill-on-exit '^toy_model: rank 0 of 2.*')" -le 1 -a "$(within "$t0" "$t1" 15 && echo y)" = y

# ---- requeue -----------------------------------------------------------------------------
train="$mnist_train --epochs 4 --checkpoint-dir"
step uninterrupted srun -n2 $train "$work/uninterrupted-ckpt"
job_id=$(sbatch --parsable --requeue -n2 -o "$work/requeue.log" --open-mode=append \
  --wrap "srun $train $work/requeue-ckpt")
until_line "$work/requeue.log" '^epoch 1/4: train loss' 60
scontrol requeue "$job_id"
# Slurm holds a requeued job for 2 minutes (its EligibleTime, squeue's
# reason BeginTime); move that to 3 s from now once it waits for it. (Not
# now: a start in the second of the requeue is refused, "Job credential
# revoked", and the job ends.)
state=
moved=
for ((i = 0; i < 600; i++)); do
  state=$(squeue -h -j "$job_id" -o %T:%r 2>&1)
  case $state in
    PENDING:BeginTime) [[ -n $moved ]] || { scontrol update JobId="$job_id" StartTime=now+3 && moved=y; } ;;
    RUNNING:*) scontrol show job "$job_id" | grep -q ' Restarts=1 ' && state=restarted && break ;;
  esac
  sleep 0.1
done
[[ $state == restarted ]] || echo "requeue: the job did not start again within 60 s (squeue: $state)"
slurm_wait_job "$job_id" 120
show requeue
final=$(grep -E '^final parameters: checksum' "$work/uninterrupted.log")
check "requeue: scontrol requeue restarts the job, which resumes from its checkpoint to the uninterrupted run's parameters" \
  test -n "$final" -a "$(count requeue '\*\*\* JOB [0-9]+ ON .* CANCELLED AT .* DUE TO JOB REQUEUE')" = 1 \
  -a "$(count requeue '^mnist_train: the launcher restarted the job \(restart 1\): resuming from the newest checkpoint')" = 1 \
  -a "$(count requeue '^mnist_train: resumed from .*epoch-[123]\.pt: [123] of 4 epochs done')" = 1 \
  -a "$(grep -cF "$final" "$work/requeue.log")" = 1

# ---- two nodes ----------------------------------------------------------------------------
# four_ranks <case> <backend>: ranks 0-3 of one world, 2 on each node.
four_ranks() {
  local r
  for r in 0 1 2 3; do
    [ "$(count "$1" "^toy_model: rank $r of 4 \(local rank $((r % 2)) of 2\) on cpu, backend $2,")" = 1 ] || return 1
  done
  [ "$(count "$1" '^checkpoint: parameters agree across 4 ranks \(max difference 0\)$')" = 4 ]
}
why=$(slurm_netns_missing)
case $work in /tmp/*) why="the test's directory $work is under /tmp, which each node replaces" ;; esac
if [[ -n $why ]]; then
  echo "slurm_cases: the two-node cases did not run: $why"
else
  slurm_stop
  start 2
  mkdir -p "$work/shared"
  export TMPDIR=$work/shared OMPI_MCA_btl_tcp_if_include=$slurm_subnet.0/24 \
    OMPI_MCA_oob_tcp_if_include=$slurm_subnet.0/24
  step nodes-srun-gloo srun -N2 -n4 "$toy_model"
  check "nodes-srun-gloo: srun -N2 -n4 on two nodes, MASTER_* derived" \
    test $rc = 0 -a "$(four_ranks nodes-srun-gloo gloo && echo y)" = y
  job nodes-sbatch-derived -N2 -n4 -- "srun $toy_model"
  check "nodes-sbatch-derived: srun in an sbatch -N2 -n4 script" \
    test $rc = 0 -a "$(four_ranks nodes-sbatch-derived gloo && echo y)" = y
  step nodes-srun-mpi env DDP_BACKEND=mpi srun -N2 -n4 --mpi=pmix "$toy_model"
  check "nodes-srun-mpi: srun -N2 -n4 --mpi=pmix, DDP_BACKEND=mpi" \
    test $rc = 0 -a "$(four_ranks nodes-srun-mpi mpi && echo y)" = y
  job nodes-sbatch-mpirun-mpi -N2 -n4 -- "DDP_BACKEND=mpi $mpirun -np 4 $toy_model"
  check "nodes-sbatch-mpirun-mpi: mpirun -np 4 in an sbatch -N2 -n4 script, DDP_BACKEND=mpi" \
    test $rc = 0 -a "$(four_ranks nodes-sbatch-mpirun-mpi mpi && echo y)" = y
fi

checks_summary slurm_cases
