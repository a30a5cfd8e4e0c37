# tests: comm/mpi
#
# The MPI backend runs in processes started by mpirun (MPI's ranks cannot be
# threads): the collective sweep (comm/collective_sweep.h) for 1 to 4 ranks,
# failures that must end the job, and the existing DDP programs and examples
# run unchanged with DDP_BACKEND=mpi. DDP_MPIEXEC_FLAGS (cmake/mpi.cmake) lets
# Open MPI's mpirun run as root (CI does) and start 3 and 4 ranks on 2 cores.

# A program that fails on purpose; in a build without MPI it checks that
# asking for MPI says so.
add_executable(mpi_failure_main comm/mpi/mpi_failure_main.cpp)
target_link_libraries(mpi_failure_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
ddp_use_test_pch(mpi_failure_main)

# DDP_BACKEND that names no backend, in every build.
ddp_add_output_test(ddp_backend_env_invalid EXIT nonzero
  REGEX "DDP_BACKEND='mip' names no backend; use gloo, nccl, mpi or fake"
  TIMEOUT 30 LABELS unit ENV "DDP_BACKEND=mip" COMMAND $<TARGET_FILE:mpi_failure_main> init)

if(NOT DDP_HAVE_MPI)
  ddp_add_output_test(mpi_backend_not_built EXIT nonzero
    REGEX "DDP_BACKEND=mpi: this ddp was built without the MPI backend"
    TIMEOUT 30 LABELS unit ENV "DDP_BACKEND=mpi" COMMAND $<TARGET_FILE:mpi_failure_main> init)
  return()
endif()

# ddp_add_mpi_test(<name> NP <n> COMMAND <target> [ARGS <args...>] TIMEOUT <s>
#                  [LABELS <labels...>] [ENV <VAR=value...>]
#                  [REGEX <regex> [MATCHES <m>]] [CASES <c>])
# Runs <target> under `mpirun -np <n>` with DDP_BACKEND=mpi, one OpenMP
# thread per rank (what ddprun sets for several ranks) and the ENV variables.
# mpirun's exit status is the test's first verdict. REGEX: besides, at least
# <m> (default 1) lines must match it; CASES: each rank must print
# "<c> of <c> cases passed" (tests/nn/rank_checks.h). Either way the
# programs' own failure words fail the test (ddp_add_output_test).
function(ddp_add_mpi_test name)
  cmake_parse_arguments(T "" "NP;COMMAND;TIMEOUT;REGEX;MATCHES;CASES" "ARGS;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    message(FATAL_ERROR "ddp_add_mpi_test(${name}): every test needs a TIMEOUT")
  endif()
  set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_NP} ${DDP_MPIEXEC_FLAGS}
      ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_COMMAND}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
  if(T_CASES)
    set(T_REGEX " ${T_CASES} of ${T_CASES} cases passed$")
    set(T_MATCHES ${T_NP})
  endif()
  if(T_REGEX)
    ddp_add_output_test(${name} EXIT 0 REGEX "${T_REGEX}" MATCHES ${T_MATCHES}
      FORBID "DIFFER|WRONG|MPI_ABORT" TIMEOUT ${T_TIMEOUT} LABELS mpi ${T_LABELS}
      COMMAND ${command})
  else()
    add_test(NAME ${name} COMMAND ${command})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "mpi;${T_LABELS}")
  endif()
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "DDP_BACKEND=mpi;OMP_NUM_THREADS=1;${T_ENV}")
endfunction()

# ---- The collective sweep and the group's own tests ------------------------------
# Built as ddp_add_gtest builds its binaries, but run under mpirun: one
# process per rank, every rank running every test in the same order. Alone it
# is a world of 1 (MPI's singleton), where the misuse checks that need a peer
# do not apply.
add_executable(process_group_mpi_test comm/mpi/process_group_mpi_test.cpp)
target_link_libraries(process_group_mpi_test PRIVATE ddp_collective_sweep ddp GTest::gtest
  GTest::gtest_main torch Threads::Threads)
target_include_directories(process_group_mpi_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
ddp_use_test_pch(process_group_mpi_test)
add_test(NAME process_group_mpi_test_1_rank
  COMMAND process_group_mpi_test --gtest_brief=1 --gtest_filter=-MpiErrors.BadArgumentsAreClearErrors)
set_tests_properties(process_group_mpi_test_1_rank PROPERTIES TIMEOUT 120 LABELS mpi)
foreach(np 2 3 4)
  ddp_add_mpi_test(process_group_mpi_test_${np}_ranks NP ${np} COMMAND process_group_mpi_test
    ARGS --gtest_brief=1 TIMEOUT 300)
endforeach()

# ---- Failures end the job --------------------------------------------------------
set(_ddp_mpirun_2 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DDP_MPIEXEC_FLAGS}
  ${MPIEXEC_PREFLAGS})
set(_ddp_failure_driver sh ${CMAKE_CURRENT_LIST_DIR}/run_mpi_failure_test.sh)
# A collective that rank 1 never joins: rank 0 gets the TimeoutError on time,
# a later collective fails at once, and destroying the group (or exiting with
# it alive) ends the job with MPI_Abort, long before rank 1's 120 s sleep.
foreach(mode stuck-destroy stuck-exit)
  add_test(NAME mpi_${mode}_ends_job
    COMMAND ${_ddp_failure_driver} 30
      "caught TimeoutError after [0-9]+ ms: \\[rank 0/2\\] allreduce #1 timed out after 1000 ms"
      "later collective failed at once: \\[rank 0/2\\] broadcast #2: not run"
      "ending the job with MPI_Abort"
      -- ${_ddp_mpirun_2} $<TARGET_FILE:mpi_failure_main> ${MPIEXEC_POSTFLAGS} ${mode})
  set_tests_properties(mpi_${mode}_ends_job PROPERTIES TIMEOUT 90 LABELS mpi
    ENVIRONMENT "DDP_BACKEND=mpi;OMP_NUM_THREADS=1")
endforeach()
# A rank killed mid-job: mpirun ends the others.
add_test(NAME mpi_killed_rank_ends_job
  COMMAND ${_ddp_failure_driver} 30 "\\[rank 1\\] killing myself"
    -- ${_ddp_mpirun_2} $<TARGET_FILE:mpi_failure_main> ${MPIEXEC_POSTFLAGS} kill)
set_tests_properties(mpi_killed_rank_ends_job PROPERTIES TIMEOUT 90 LABELS mpi
  ENVIRONMENT "DDP_BACKEND=mpi;OMP_NUM_THREADS=1")
# Two processes that ddprun-style variables describe as one job, without an
# MPI launcher: the error says to use mpirun.
ddp_add_output_test(mpi_outside_mpi_launcher EXIT nonzero
  REGEX "MPI sees this process as a world of its own.*DDP_BACKEND=mpi mpirun -np 2"
  TIMEOUT 60 LABELS mpi
  ENV "DDP_BACKEND=mpi;WORLD_SIZE=2;RANK=0;MASTER_ADDR=127.0.0.1;MASTER_PORT=1"
  COMMAND $<TARGET_FILE:mpi_failure_main> init)
# A shared-memory threshold that is not a number.
ddp_add_output_test(mpi_shared_memory_env_invalid EXIT nonzero
  REGEX "DDP_MPI_SHARED_MEMORY_MIN_BYTES='64k' is not a byte count"
  TIMEOUT 60 LABELS mpi ENV "DDP_BACKEND=mpi;DDP_MPI_SHARED_MEMORY_MIN_BYTES=64k"
  COMMAND $<TARGET_FILE:mpi_failure_main> init)
# ddprun does not start MPI jobs, and says which launcher does.
ddp_add_output_test(ddprun_refuses_mpi EXIT nonzero REGEX "^  DDP_BACKEND=mpi mpirun -np 2 .*mpi_failure_main init$"
  TIMEOUT 30 LABELS mpi ENV "DDP_BACKEND=mpi"
  COMMAND $<TARGET_FILE:ddprun> --nproc-per-node 2 $<TARGET_FILE:mpi_failure_main> init)

# The backend with CUDA tensors, run by hand on a GPU machine (no CTest test:
# the machines that run the suite have no GPU):
#   DDP_BACKEND=mpi mpirun -np 2 build/tests/mpi_cuda_main
add_executable(mpi_cuda_main comm/mpi/mpi_cuda_main.cpp)
target_link_libraries(mpi_cuda_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
ddp_use_test_pch(mpi_cuda_main)

# ---- DDP, Join and the examples, unchanged, on MPI --------------------------------
# The programs are defined in tests/nn/nn.cmake and examples/.
ddp_add_mpi_test(ddp_parity_mpi_2_ranks NP 2 COMMAND ddp_parity_main CASES 28 TIMEOUT 120)
# Subgroups as communicators of MPI_COMM_WORLD (tests/comm/comm.cmake).
ddp_add_mpi_test(subgroups_mpi_4_ranks NP 4 COMMAND subgroups_main CASES 10 TIMEOUT 180)
ddp_add_mpi_test(ddp_parity_mpi_3_ranks NP 3 COMMAND ddp_parity_main CASES 28 TIMEOUT 180)
# Every bucket in shared memory (Note [Shared buffers]), however small:
# the same parity, and the program checks that the buckets are shared.
foreach(np 2 3)
  ddp_add_mpi_test(ddp_parity_mpi_${np}_ranks_shared_buckets NP ${np} COMMAND ddp_parity_main
    CASES 28 TIMEOUT 180 ENV DDP_MPI_SHARED_MEMORY_MIN_BYTES=0)
endforeach()
# Sparse gradients through the MPI backend's sparse allreduce (Note [Sparse
# allreduce over MPI]): the same checks as ddp_sparse_{2,3}_ranks on Gloo.
ddp_add_mpi_test(ddp_sparse_mpi_2_ranks NP 2 COMMAND ddp_sparse_main CASES 9 TIMEOUT 90)
ddp_add_mpi_test(ddp_sparse_mpi_3_ranks NP 3 COMMAND ddp_sparse_main CASES 9 TIMEOUT 120)
foreach(np 2 3)
  # Its own scratch folder: the program names its checkpoint after
  # MASTER_PORT, which mpirun does not set.
  set(_ddp_scratch ${CMAKE_CURRENT_BINARY_DIR}/mpi_join_${np}_ranks)
  file(MAKE_DIRECTORY ${_ddp_scratch})
  ddp_add_mpi_test(ddp_join_checkpoint_mpi_${np}_ranks NP ${np} COMMAND ddp_join_checkpoint_main
    ARGS ${_ddp_scratch} $<TARGET_FILE:ddp_checkpoint_plain_load> TIMEOUT 180)
endforeach()
# Join with shared buckets: a rank that has joined reduces private zeros,
# the others their shared buckets, and the allreduce takes messages.
set(_ddp_scratch ${CMAKE_CURRENT_BINARY_DIR}/mpi_join_shared)
file(MAKE_DIRECTORY ${_ddp_scratch})
ddp_add_mpi_test(ddp_join_checkpoint_mpi_2_ranks_shared_buckets NP 2 COMMAND ddp_join_checkpoint_main
  ARGS ${_ddp_scratch} $<TARGET_FILE:ddp_checkpoint_plain_load> TIMEOUT 180
  ENV DDP_MPI_SHARED_MEMORY_MIN_BYTES=0)
if(DDP_BUILD_EXAMPLES)
  ddp_add_mpi_test(toy_model_mpi_2_ranks NP 2 COMMAND toy_model TIMEOUT 90
    REGEX "checkpoint: parameters agree across 2 ranks \\(max difference 0\\)" MATCHES 2)
  ddp_add_mpi_test(allreduce_example_mpi_4_ranks NP 4 COMMAND allreduce_example TIMEOUT 90
    REGEX "allreduce gave 10 \\(expected 1 \\+ 2 \\+ ... \\+ 4 = 10\\): OK" MATCHES 4)
endif()

# ---- Collective fingerprints -----------------------------------------------------
# Ranks that call different collectives at the same point: every rank raises
# CollectiveMismatchError naming both calls, and the group stays usable
# (Note [MPI fingerprint check]). A crash or a wrong sum fails the test.
add_executable(mpi_mismatch_test comm/mpi/mpi_mismatch_test.cpp)
target_link_libraries(mpi_mismatch_test PRIVATE ddp GTest::gtest GTest::gtest_main torch Threads::Threads)
target_include_directories(mpi_mismatch_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
ddp_use_test_pch(mpi_mismatch_test)
ddp_add_mpi_test(mpi_mismatch_test_2_ranks NP 2 COMMAND mpi_mismatch_test ARGS --gtest_brief=1 TIMEOUT 120)
