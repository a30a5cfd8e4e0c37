#!/usr/bin/env bash
# Induced faults, each read back by `ddprun --analyze` (Note [Flight
# recorder] in src/flight_recorder/flight_recorder.cpp). Usage:
#   flight_recorder_cases.sh <flight_recorder_main> <ddprun> <python3> [mpirun]
# Two ranks on Gloo, started as plain processes:
#   skip-signal   rank 1 skips allreduce #5; once it idles, both ranks get
#                 SIGUSR1 and dump: the verdict names rank 1 (never called
#                 #5, its last was #4) and rank 0 (waits in it);
#   skip-timeout  the same, but rank 0 times out in #5 (3 s) and dumps on
#                 its own; rank 1 dumps on SIGUSR1: rank 0 failed in it;
#   size          rank 1 calls #5 with 8 floats, rank 0 with 4: both fail
#                 and dump, and the analyzer shows the mismatch;
#   ok            nothing goes wrong: every rank completed everything;
#   bad-size      DDP_FLIGHT_RECORDER_SIZE=lots: every rank's group refused,
#                 the error naming the rank and the variable;
#   empty         a directory with no dump: ddprun --analyze says so, exit 1.
# Two ranks under ddprun, which asks the running ranks for their dumps
# before it stops them (Note [Dumps at teardown]):
#   teardown      rank 1 skips #5, rank 0 times out (3 s) and fails: ddprun
#                 asks rank 1 for its dump; the verdict names both;
#   sigstop       the same, with rank 1 SIGSTOPped while it idles: ddprun
#                 continues it to get its dump;
#   sigkill       rank 1 is SIGKILLed while rank 0 waits in #5 (30 s):
#                 rank 0 dumps (asked by ddprun, or failing on the lost
#                 peer), rank 1 has none; the verdict names rank 1 (no
#                 dump) and rank 0 (in #5).
#   first-kill-4  4 ranks in a loop of allreduces, rank 3 SIGKILLed: ddprun
#                 records it as the first failure (launcher.json), and the
#                 analyzer's "first failure" line names it;
#   first-kill-8  the same with 8 ranks and rank 5;
#   first-stop    4 ranks, rank 2 SIGSTOPped: the others time out (3 s);
#                 ddprun sees a survivor exit, but names the stopped rank,
#                 which then dumps too (continued by ddprun);
#   first-dumped  4 ranks, rank 1 writes its dump and exits 3 on its own:
#                 every rank has a dump, and rank 1 is still named first
#                 (by ddprun, or by the ranks' errors when ddprun saw a
#                 survivor end first);
#   two-jobs      two teardown jobs at once, with no DDP_FLIGHT_RECORDER_DIR:
#                 each writes to a folder of its own under
#                 $TMPDIR/ddp_flight_recorder (ddprun names it), whose
#                 analysis is its own; a folder holding dumps of both is
#                 refused by --analyze, naming the two jobs.
# PyTorch's own flight recorder dumps, in its JSON form (made by
# pytorch_dumps/make_dumps.py with PyTorch 2.11 on Gloo; its file names):
#   pytorch-skip  rank 1 never called all_reduce #6, rank 0 waits in it;
#   pytorch-size  the ranks called #6 with 4 and 8 floats: the mismatch.
# With an mpirun, the same program on MPI (DDP_BACKEND=mpi, 2 ranks):
#   mpi-skip      rank 1 skips allreduce #5; SIGUSR1 to mpirun, which passes
#                 it to the ranks: rank 1 never called it, rank 0 waits in it;
#   mpi-size      different sizes: the mismatch.
# Prints "flight_recorder_cases: N of N checks passed" at the end (checks.sh).
set -uo pipefail
. "$(dirname "$0")/../testing/free_port.sh"
. "$(dirname "$0")/../testing/checks.sh"
. "$(dirname "$0")/../testing/until_line.sh"
program=$1
ddprun=$2
python=$3
mpirun=${4:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-flight-recorder.XXXXXX")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

verdict() { # <case> <regex>: the analyzer's output has a line matching it
  grep -qE "$2" "$work/$1/analysis.txt"
}

# run <case> <mode> <timeout>: starts both ranks in the background (no
# `timeout` wrapper: the signals must reach the ranks; the EXIT trap and
# CTest's TIMEOUT bound them); sets $p0 $p1 and the case's directory $dir
# (dumps in $dir/fr).
run() {
  dir=$work/$1
  mkdir -p "$dir/fr"
  local port r
  port=$(free_port "$python")
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      DDP_FLIGHT_RECORDER_DIR=$dir/fr OMP_NUM_THREADS=1 "$program" "$2" "$3" \
      >"$dir/$r.log" 2>&1 &
    eval "p$r=\$!"
  done
}
analyze() {
  "$ddprun" --analyze "$dir/fr" >"$dir/analysis.txt" 2>&1
  local rc=$?
  sed "s/^/  $1: /" "$dir/analysis.txt"
  return $rc
}

# skip-signal
run skip-signal skip 30
until_line "$dir/1.log" '^flight_recorder: rank 1 idle'
sleep 1 # rank 0 is in allreduce #5 by now
kill -USR1 $p0 $p1
until_line "$dir/fr/rank_0.json" '\]\}$'; until_line "$dir/fr/rank_1.json" '\]\}$'
kill -9 $p0 $p1; wait $p0 $p1 2>/dev/null
analyze skip-signal
check skip-signal verdict skip-signal \
  '^group default \(gloo, 2 ranks\), allreduce #5: rank 1 never called it \(its last was allreduce #4\); rank 0 waits in it since [0-9]+\.[0-9] s$'

# skip-timeout
run skip-timeout skip 3
until_line "$dir/1.log" '^flight_recorder: rank 1 idle'
wait $p0; rc0=$?
kill -USR1 $p1
until_line "$dir/fr/rank_1.json" '\]\}$'
kill -9 $p1; wait $p1 2>/dev/null
analyze skip-timeout
check skip-timeout test $rc0 = 3 -a -s "$dir/fr/rank_0.json" -a "$(grep -c '^flight_recorder: rank 0 caught: .*timed out' "$dir/0.log")" = 1
check skip-timeout-verdict verdict skip-timeout \
  '^group default \(gloo, 2 ranks\), allreduce #5: rank 1 never called it \(its last was allreduce #4\); rank 0 (failed in it: \[rank 0/2\] allreduce #5.*timed out|waits in it since [0-9.]+ s$)'

# size
run size size 3
wait $p0; rc0=$?; wait $p1; rc1=$?
analyze size
check size test $rc0 = 3 -a $rc1 = 3
check size-verdict verdict size \
  '^  mismatch at #5: rank 0 called allreduce float32\[4\] SUM, rank 1 called allreduce float32\[8\] SUM$'

# ok
run ok ok 10
wait $p0; rc0=$?; wait $p1; rc1=$?
analyze ok
check ok test $rc0 = 0 -a $rc1 = 0
check ok-verdict verdict ok \
  '^group default \(gloo, 2 ranks\): every rank that wrote a dump completed every collective it recorded \(the last: allreduce #5\)$'

# bad-size: DDP_FLIGHT_RECORDER_SIZE that is not a count refuses the group
DDP_FLIGHT_RECORDER_SIZE=lots run bad-size ok 10
wait $p0; rc0=$?; wait $p1; rc1=$?
check bad-size test $rc0 = 3 -a $rc1 = 3 -a "$(grep -c "^flight_recorder: rank 0 caught: \[rank 0/2\] creating a gloo process group: DDP_FLIGHT_RECORDER_SIZE must be a whole number of collectives in \[0, 1000000\] (0 turns the flight recorder off), got 'lots'$" "$dir/0.log")" = 1

# empty
dir=$work/empty; mkdir -p "$dir/fr"
analyze empty; rc=$?
check empty test $rc = 1 -a "$(grep -c 'no flight recorder dump in' "$dir/analysis.txt")" = 1

# launched <case> <mode> <timeout>: both ranks under ddprun, in the
# background; sets $pl and $dir.
launched() {
  dir=$work/$1
  mkdir -p "$dir/fr"
  DDP_FLIGHT_RECORDER_DIR=$dir/fr OMP_NUM_THREADS=1 "$ddprun" --nproc-per-node 2 "$program" "$2" "$3" \
    >"$dir/ddprun.log" 2>&1 &
  pl=$!
}
# The pid that rank 1 printed in its idle line.
idle_pid() {
  sed -nE 's/^\[rank 1\]: flight_recorder: rank 1 idle \(pid ([0-9]+)\)$/\1/p' "$dir/ddprun.log"
}
asked() { # <ranks>: ddprun said it asked them for their dumps
  grep -qE "^ddprun: asked rank\(s\) $1 for their flight recorder dumps \(SIGUSR1; .ddprun --analyze $dir/fr. reads them\); stopping in 0.5 s$" "$dir/ddprun.log"
}

# teardown
launched teardown skip 3
wait $pl; rc=$?
analyze teardown
check teardown test $rc = 3 -a -s "$dir/fr/rank_1.json"
check teardown-asked asked 1
check teardown-verdict verdict teardown \
  '^group default \(gloo, 2 ranks\), allreduce #5: rank 1 never called it \(its last was allreduce #4\); rank 0 failed in it: \[rank 0/2\] allreduce #5.*timed out'

# sigstop
launched sigstop skip 4
until_line "$dir/ddprun.log" '^\[rank 1\]: flight_recorder: rank 1 idle'
kill -STOP "$(idle_pid)"
wait $pl; rc=$?
analyze sigstop
check sigstop test $rc = 3 -a -s "$dir/fr/rank_1.json"
check sigstop-verdict verdict sigstop \
  '^group default \(gloo, 2 ranks\), allreduce #5: rank 1 never called it \(its last was allreduce #4\); rank 0 failed in it: \[rank 0/2\] allreduce #5.*timed out'

# sigkill
launched sigkill skip 30
until_line "$dir/ddprun.log" '^\[rank 1\]: flight_recorder: rank 1 idle'
sleep 1 # rank 0 is in allreduce #5 by now
kill -KILL "$(idle_pid)"
wait $pl; rc=$?
analyze sigkill
# Rank 0 either still waits when ddprun asks it for its dump (ddprun exits
# 137, rank 1's death), or has already failed on the lost connection and
# dumped on its own (exit 3).
check sigkill test \( $rc = 137 -o $rc = 3 \) -a -s "$dir/fr/rank_0.json" -a ! -e "$dir/fr/rank_1.json"
check sigkill-verdict verdict sigkill \
  '^group default \(gloo, 2 ranks\), allreduce #5: rank 1 left no dump \(killed, or its flight recorder off\); rank 0 (waits in it since [0-9]+\.[0-9] s|failed in it: .*)$'

# launched_n <case> <nproc> <timeout>: `loop` on nproc ranks under ddprun,
# in the background; waits until every rank loops; sets $pl and $dir.
launched_n() {
  dir=$work/$1
  mkdir -p "$dir/fr"
  DDP_FLIGHT_RECORDER_DIR=$dir/fr OMP_NUM_THREADS=1 "$ddprun" --nproc-per-node "$2" "$program" loop "$3" \
    >"$dir/ddprun.log" 2>&1 &
  pl=$!
  local r
  for ((r = 0; r < $2; ++r)); do
    until_line "$dir/ddprun.log" "^\[rank $r\]: flight_recorder: rank $r looping"
  done
}
loop_pid() { # <rank>
  sed -nE "s/^\[rank $1\]: flight_recorder: rank $1 looping \(pid ([0-9]+)\)$/\1/p" "$dir/ddprun.log"
}
first() { # <case> <regex>: the analyzer's "first failure" line matches it
  verdict "$1" "^  first failure: $2\$"
}

# first-kill-4, first-kill-8
for n in 4 8; do
  victim=$((n == 4 ? 3 : 5))
  launched_n "first-kill-$n" $n 30
  kill -KILL "$(loop_pid $victim)"
  wait $pl
  analyze "first-kill-$n"
  check "first-kill-$n" first "first-kill-$n" "rank $victim \(ddprun saw it: it was killed by signal 9 \(SIGKILL\)\)"
done

# first-stop
launched_n first-stop 4 3
kill -STOP "$(loop_pid 2)"
wait $pl
analyze first-stop
check first-stop first first-stop \
  'rank 2 \(ddprun saw it: it was stopped \(SIGSTOP or a debugger\) when rank [013] exited with code 3\)'
check first-stop-dumped test -s "$dir/fr/rank_2.json"

# first-dumped
DDP_TEST_GIVE_UP=1 launched_n first-dumped 4 30
wait $pl
analyze first-dumped
# ddprun may see a survivor end before rank 1 (whose exit takes longer than
# its connections' end): the ranks' errors then name rank 1.
check first-dumped first first-dumped \
  'rank 1 \((ddprun saw it: it exited with code 3|as the ranks. errors say; ddprun saw rank [023] end first: it exited with code 3)\)'
check first-dumped-all test -s "$dir/fr/rank_0.json" -a -s "$dir/fr/rank_1.json" -a -s "$dir/fr/rank_2.json" \
  -a -s "$dir/fr/rank_3.json"

# two-jobs
dir=$work/two-jobs
mkdir -p "$dir/tmp"
for job in a b; do
  TMPDIR=$dir/tmp OMP_NUM_THREADS=1 "$ddprun" --nproc-per-node 2 "$program" skip 3 >"$dir/$job.log" 2>&1 &
  eval "p$job=\$!"
done
wait "$pa"; wait "$pb"
folders=$(ls "$dir/tmp/ddp_flight_recorder")
check two-jobs-folders test "$(echo "$folders" | grep -c '^ddprun-')" = 2
for job in a b; do
  # ddprun names its job's folder when it asks the ranks for their dumps.
  named=$(sed -nE 's/^ddprun: asked rank\(s\) 1 for their flight recorder dumps \(SIGUSR1; .ddprun --analyze ([^ ]+). reads them\).*/\1/p' "$dir/$job.log")
  check "two-jobs-$job-own-folder" test -n "$named" -a -s "$named/rank_0.json" -a -s "$named/rank_1.json"
  "$ddprun" --analyze "$named" >"$dir/analysis-$job.txt" 2>&1
  check "two-jobs-$job-verdict" grep -qE '^group default \(gloo, 2 ranks\), allreduce #5: rank 1 never called it' "$dir/analysis-$job.txt"
done
first=$(echo "$folders" | sed -n 1p)
second=$(echo "$folders" | sed -n 2p)
mkdir -p "$dir/mixed"
cp "$dir/tmp/ddp_flight_recorder/$first/rank_0.json" "$dir/mixed/"
cp "$dir/tmp/ddp_flight_recorder/$second/rank_1.json" "$dir/mixed/"
"$ddprun" --analyze "$dir/mixed" >"$dir/mixed.txt" 2>&1; rc=$?
check two-jobs-mixed-refused test $rc = 1 -a "$(grep -c "holds the dumps of 2 jobs: job '$first' (world size 2): rank(s) 0; job '$second' (world size 2): rank(s) 1" "$dir/mixed.txt")" = 1

# PyTorch's dumps
fixtures=$(cd "$(dirname "$0")" && pwd)/pytorch_dumps
dir=$work/pytorch-skip; mkdir -p "$dir"; cp -r "$fixtures/skip" "$dir/fr"
analyze pytorch-skip
check pytorch-skip verdict pytorch-skip \
  '^group default \(gloo, 2 ranks\), all_reduce #6: rank 1 never called it \(its last was all_reduce #5\); rank 0 issued it and waits for it$'
dir=$work/pytorch-size; mkdir -p "$dir"; cp -r "$fixtures/size" "$dir/fr"
analyze pytorch-size
check pytorch-size verdict pytorch-size \
  '^  mismatch at #6: rank 0 called all_reduce Float\[4\], rank 1 called all_reduce Float\[8\]$'

if [[ -n $mpirun ]]; then
  # mpi_run <case> <mode> <timeout>: both ranks under mpirun, in the
  # background; sets $pm and $dir.
  mpi_run() {
    dir=$work/$1
    mkdir -p "$dir/fr"
    DDP_BACKEND=mpi DDP_FLIGHT_RECORDER_DIR=$dir/fr OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
      "$mpirun" -np 2 "$program" "$2" "$3" >"$dir/mpirun.log" 2>&1 &
    pm=$!
  }
  mpi_run mpi-skip skip 30
  until_line "$dir/mpirun.log" '^flight_recorder: rank 1 idle'
  sleep 1
  kill -USR1 $pm
  until_line "$dir/fr/rank_0.json" '\]\}$'; until_line "$dir/fr/rank_1.json" '\]\}$'
  kill -TERM $pm; wait $pm 2>/dev/null
  analyze mpi-skip
  check mpi-skip verdict mpi-skip \
    '^group default \(mpi, 2 ranks\), allreduce #5: rank 1 never called it \(its last was allreduce #4\); rank 0 waits in it since [0-9]+\.[0-9] s$'

  mpi_run mpi-size size 5
  wait $pm
  analyze mpi-size
  check mpi-size verdict mpi-size \
    '^  mismatch at #5: rank 0 called allreduce float32\[4\] SUM, rank 1 called allreduce float32\[8\] SUM$'
fi

checks_summary flight_recorder_cases
