# Sourced by the shell tests (expect_output.sh, run_blas_check_test.sh,
# rendezvous_progress.sh, flight_recorder_cases.sh, slurm_cases.sh,
# torchrun_elastic.sh, pytorchjob_env.sh): a
# named check and the count that the test prints at the end, so that a run
# shows what it checked and how many of its checks passed.
#
#   check DESCRIPTION COMMAND [ARGS...]   runs COMMAND; prints "ok: ..." or
#                                         "FAILED: ..." and counts it
#   checks_summary NAME                   prints "NAME: P of N checks passed";
#                                         returns 1 if any failed
checks_ran=0
checks_failed=0

check() {
  checks_description=$1
  shift
  checks_ran=$((checks_ran + 1))
  if "$@"; then
    echo "ok: $checks_description"
  else
    echo "FAILED: $checks_description"
    checks_failed=$((checks_failed + 1))
  fi
}

checks_summary() {
  echo "$1: $((checks_ran - checks_failed)) of $checks_ran checks passed"
  [ "$checks_failed" -eq 0 ]
}
