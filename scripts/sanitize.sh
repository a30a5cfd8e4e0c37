#!/usr/bin/env bash
# Builds ddp with sanitizers and runs the tests under them, against Debian's
# LibTorch 1.13 (the README's configuration; run scripts/setup.sh first, or
# let this script run it).
#
# Usage: bash scripts/sanitize.sh [address|thread|all]     (default: all)
#
#   address  ASan + UBSan (-fsanitize=address,undefined, no recovery):
#            build-asan/: libddp, ddprun and the examples instrumented, the
#            tests' own code compiled without it, as in build/, and linked
#            with the runtime (tests/CMakeLists.txt says why). The CTest
#            suite runs but the tests named in ASAN_SKIPPED below (the NCCL
#            compile check, and repeats of programs at other sizes or in
#            other modes; scripts/test.sh has run them). The install test's
#            consumer links the installed, instrumented libddp with the same
#            flags through ddp::ddp. The benchmarks are not built.
#   thread   TSan: build-tsan/, a subset: the store, process-group, DDP and
#            launcher tests named in TSAN_TESTS below. LibTorch, Gloo and
#            OpenMP are not instrumented, so synchronisation done inside them
#            is invisible to TSan; the subset is the code whose threads are
#            ours (stores, the Gloo worker queue, ddprun, the reducer's hooks).
#            scripts/tsan.supp suppresses reports whose synchronisation
#            happens inside that uninstrumented code (Gloo's error path,
#            libsupc++'s exception_ptr count, LibTorch's own copy of the
#            tensor reference count), each with the reason.
#
# Exits non-zero when a build fails or a sanitizer reports (a report fails
# its test: ASan/UBSan abort, TSan exits with 66). Prints one count line per
# configuration last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

# What ASan leaves out of the suite (scripts/test.sh runs all of it): the
# NCCL compile check, which runs no code; and runs that repeat, at another
# world size or in another mode, a program whose code ASan already runs in
# the suite: the MNIST example's resume, restart, PowerSGD, local SGD, ZeRO,
# FSDP, checkpoint-format and IDX runs, and its random-fault runs
# (mnist_chaos_short*, and gpt_chaos_short: the same programs killed and
# resumed, whose timing windows ASan's slowness would only stretch;
# gpt_train_parity runs gpt_train's DCP resume) (mnist_train_accuracy stays;
# checkpoint_test, checkpoint_crash_test, the checkpoint-format, PowerSGD,
# hook-resume, ZeRO and FSDP tests run that code), the 3-rank runs of FSDP
# (with auto-wrap, deferred construction and activation checkpointing, whose
# 2-rank runs stay), the object collectives, the hook resume, DDP's parity
# with PyTorch and the averagers (2 ranks and alone stay, on Gloo and MPI),
# ZeRO at 3 ranks (zero_2_ranks and zero_mpi_2_ranks stay), the sweep of
# exits during start-up (init_test and gloo_reinit_test stay; 76 s under
# ASan on 2026-11-27), two of the three torchrun rendezvous modes (standalone stays; torch_tcp_store_test runs the store
# client), the MPI group's 4-rank run (2 and 3 ranks stay), and the launcher
# cases under a real Slurm and torchrun's elastic agent (toy_model and
# mnist_train again, started by srun, sbatch, mpirun and torchrun; init_test
# runs the code that reads their variables, mnist_train_restart the resume).
# About 160 s of the ASan run's test time (2026-11-26), and about 90 s more
# for those added on 2026-11-27.
readonly ASAN_SKIPPED='^(nccl_backend_compiles|mnist_train_(resume|restart|powersgd|localsgd|zero1|fsdp|formats|idx)|mnist_chaos_short(_torchrun)?|gpt_chaos_short|toy_model_torchrun_(static|c10d)|process_group_mpi_test_4_ranks|fsdp_(3_ranks|mpi_3_ranks|auto_wrap_3_ranks|deferred_init_3_ranks)|activation_checkpoint_(mpi_)?3_ranks|objects_(3_ranks|mpi_3_ranks)|ddp_hook_resume_3_ranks|ddp_pytorch_parity_3_ranks|averaging_3_ranks|zero_(mpi_)?3_ranks|init_exit_sweep|slurm_cases|torchrun_elastic|plan_fsdp_1024)$'
readonly TSAN_TESTS='^(store_test|tcp_store_test|file_store_test|process_group_gloo_test|process_group_composite_test|gloo_reliability_test|init_test|ddprun_options_test|ddprun_test|distributed_data_parallel_test|ddp_parity_2_ranks|toy_model_2_ranks)$'
# What those tests run; TSan builds only these.
readonly TSAN_TARGETS='ddp ddprun store_test tcp_store_test file_store_test process_group_gloo_test process_group_composite_test gloo_reliability_test init_test ddprun_options_test ddprun_test distributed_data_parallel_test ddp_parity_main toy_model'

case ${1:-all} in
  address) kinds=(address) ;;
  thread) kinds=(thread) ;;
  all) kinds=(address thread) ;;
  *) echo "sanitize.sh: unknown kind '$1' (expected address, thread or all)" >&2; exit 2 ;;
esac

declare -A summary
failed=0
for kind in "${kinds[@]}"; do
  build=build-asan
  filter=(-E "$ASAN_SKIPPED")
  targets=all # setup.sh alone builds only what the README's first command runs
  if [[ $kind == thread ]]; then
    build=build-tsan
    filter=(-R "$TSAN_TESTS")
    targets=$TSAN_TARGETS
  fi
  echo "sanitize.sh: [$kind] building $build"
  # Release, as scripts/test.sh's build: the instrumented code then gets
  # -O1 with line tables after it (DDP_SANITIZE_OPT_FLAGS in CMakeLists.txt:
  # readable reports, tests fast enough, half the build time of -O2 -g), and
  # under ASan the tests' own code compiles exactly as in build/, whose
  # objects the compiler cache then reuses (tests/CMakeLists.txt).
  # The benchmarks are left out (their smoke tests check output formats).
  if ! DDP_BUILD_DIR=$build DDP_BUILD_TARGETS=$targets \
      DDP_CMAKE_ARGS="-DDDP_SANITIZE=$kind -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_BENCHMARKS=OFF" \
      bash scripts/setup.sh "$build"; then
    summary[$kind]="build FAILED"
    failed=1
    continue
  fi
  # A filter CTest cannot compile (CMake's regular expressions hold at most
  # 10 groups) selects every test, silently: refuse it.
  all=$(ctest --test-dir "$build" -N | grep -cE '^ *Test +#')
  chosen=$(ctest --test-dir "$build" -N "${filter[@]}" | grep -cE '^ *Test +#')
  if [[ $chosen -eq 0 || $chosen -eq $all ]]; then
    summary[$kind]="test filter FAILED: ${filter[0]} selects $chosen of $all tests"
    failed=1
    continue
  fi
  log=$(mktemp)
  # Leaks in LibTorch's and Gloo's one-time allocations are not ours: leak
  # detection stays off; every other ASan report aborts the test.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp" \
    ctest --test-dir "$build" --output-on-failure -j"${DDP_TEST_JOBS:-2}" "${filter[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  count=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  rm -f "$log"
  summary[$kind]=${count:-"ctest printed no summary (exit code $rc)"}
  [[ $rc -eq 0 ]] || failed=1
  # The TSan subset is a list of names: a test renamed or gone would drop out
  # of it silently, so the count must be the list's length.
  if [[ $kind == thread ]]; then
    expected=$(sed -E 's/^\^\(//; s/\)\$$//' <<<"$TSAN_TESTS" | tr '|' '\n' | wc -l)
    ran=$(sed -nE 's/.* out of ([0-9]+)$/\1/p' <<<"$count")
    if [[ $ran != "$expected" ]]; then
      summary[$kind]="${summary[$kind]} -- FAILED: TSAN_TESTS names $expected tests, ctest ran ${ran:-none}"
      failed=1
    fi
  fi
done

echo
for kind in "${kinds[@]}"; do
  echo "sanitize $kind: ${summary[$kind]}"
done
exit "$failed"
