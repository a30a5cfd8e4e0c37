# tests: gpu
#
# The GPU tests: the NCCL backend (collectives, Work::wait stream semantics,
# the watchdog, the collective fingerprint check, the flight recorder, the
# timeline, object collectives and uneven all-to-all), Gloo with CUDA
# tensors, and DistributedDataParallel, ZeroRedundancyOptimizer and
# FullyShardedDataParallel on CUDA against the CPU. They are built only with the NCCL backend
# (DDP_HAVE_NCCL), carry the label "gpu", and skip with "no CUDA device: NCCL
# tests need a GPU" on a machine without one.
#
# In a build without the backend, one test stands in for them:
# `nccl_backend_compiles` builds
# ddp_nccl_syntax_check (src/comm/nccl/nccl.cmake), which type-checks the backend
# against the CUDA, NCCL and c10/cuda headers without linking anything. It is
# skipped, saying why, when those headers are absent.
set(DDP_GPU_TEST_SOURCES
  gpu/process_group_nccl_test.cpp
  gpu/nccl_work_test.cpp
  gpu/nccl_watchdog_test.cpp
  gpu/nccl_fingerprint_test.cpp
  gpu/nccl_flight_recorder_test.cpp
  gpu/nccl_timeline_test.cpp
  gpu/nccl_features_test.cpp
  gpu/gloo_cuda_test.cpp
  gpu/composite_cuda_test.cpp
  gpu/ddp_cuda_test.cpp
  gpu/ddp_cuda_parity_main.cpp
  gpu/zero_cuda_parity_main.cpp
  gpu/fsdp_cuda_parity_main.cpp)

# ---- The compile check ---------------------------------------------------------------
set(_ddp_skip_code 77)
if(DDP_HAVE_NCCL)
  # The backend and these tests are compiled and linked below.
elseif(TARGET ddp_nccl_syntax_check)
  # The backend only: the GPU tests' sources are compiled for real by the
  # CUDA configuration (scripts/compat.sh cuda, in CI), against the only
  # LibTorch they run with; type-checking them against a CPU-only LibTorch
  # too cost about 2.5 minutes of CPU per suite.
  # Two jobs: Torch's headers make each compile heavy, and this may run
  # beside other tests.
  add_test(NAME nccl_backend_compiles
    COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ddp_nccl_syntax_check --parallel 2)
else()
  add_test(NAME nccl_backend_compiles
    COMMAND sh -c "echo 'nccl_backend_compiles: skipped: ${DDP_NCCL_SYNTAX_CHECK_SKIP_REASON}'; exit ${_ddp_skip_code}")
endif()
if(NOT DDP_HAVE_NCCL)
  set_tests_properties(nccl_backend_compiles PROPERTIES
    TIMEOUT 300 SKIP_RETURN_CODE ${_ddp_skip_code} LABELS "gpu")
endif()

if(NOT DDP_HAVE_NCCL)
  return()
endif()

# ---- The GPU tests -------------------------------------------------------------------
# ddp_add_gpu_gtest(<name> <source> <timeout>): a gtest binary that links the
# CUDA runtime and reports "skipped" to CTest when there is no device.
function(ddp_add_gpu_gtest name source timeout)
  ddp_add_gtest(${name} SOURCES ${source} LIBS ddp_testing ddp_nccl_deps TIMEOUT ${timeout}
    LABELS gpu)
  set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "no CUDA device: NCCL tests need a GPU")
endfunction()

# NCCL collectives: world size 1 on any GPU, 2 and 4 with as many GPUs.
ddp_add_gpu_gtest(process_group_nccl_test gpu/process_group_nccl_test.cpp 300)
# Work::wait: stream ordering without a CPU block, blocking with a deadline.
ddp_add_gpu_gtest(nccl_work_test gpu/nccl_work_test.cpp 120)
# Deadlines and the watchdog: no hang when a peer never comes or an
# operation is stuck; the group is unusable after.
ddp_add_gpu_gtest(nccl_watchdog_test gpu/nccl_watchdog_test.cpp 180)
# Ranks that call different collectives (Note [NCCL fingerprint check]), in
# processes with a GPU each: CollectiveMismatchError naming both calls on
# every rank, never a crash, a hang or garbage counted as a success. Needs 2
# GPUs; skips saying so with fewer.
ddp_add_gpu_gtest(nccl_fingerprint_test gpu/nccl_fingerprint_test.cpp 600)
# The flight recorder on an NCCL group: shapes and states, the dump of a
# wait() that timed out on the GPU.
ddp_add_gpu_gtest(nccl_flight_recorder_test gpu/nccl_flight_recorder_test.cpp 120)
# The step timeline of DDP on CUDA over NCCL: steps, buckets and the NCCL
# group's collectives in the trace (its own program: DDP_TRACE_DIR is read
# once per process).
ddp_add_gpu_gtest(nccl_timeline_test gpu/nccl_timeline_test.cpp 120)
# Object collectives through a device buffer, uneven and list all-to-all,
# batched point-to-point's refusals, DDP's refusal of sparse gradients.
ddp_add_gpu_gtest(nccl_features_test gpu/nccl_features_test.cpp 120)
# Gloo with CUDA tensors, world size 2 as threads on one GPU.
ddp_add_gpu_gtest(gloo_cuda_test gpu/gloo_cuda_test.cpp 180)
# Backend::kAuto: Gloo for CPU tensors and NCCL for CUDA tensors in one group.
ddp_add_gpu_gtest(composite_cuda_test gpu/composite_cuda_test.cpp 180)
# DistributedDataParallel on CUDA over NCCL at world size 1 against the CPU.
ddp_add_gpu_gtest(ddp_cuda_test gpu/ddp_cuda_test.cpp 120)

# DDP parity on CUDA at world size 2 under ddprun. GTest::gtest only for the
# shared precompiled header, as in tests/nn.
add_executable(gpu_ddp_parity_main gpu/ddp_cuda_parity_main.cpp)
target_link_libraries(gpu_ddp_parity_main PRIVATE ddp ddp_nccl_deps torch GTest::gtest Threads::Threads)
target_include_directories(gpu_ddp_parity_main PRIVATE ${PROJECT_SOURCE_DIR}/tests)
ddp_use_test_pch(gpu_ddp_parity_main)

# Gloo ranks may share a GPU; NCCL needs one per rank and skips otherwise.
foreach(backend gloo nccl)
  ddp_add_launched_test(gpu_ddp_parity_${backend}_2_ranks NPROC 2 COMMAND gpu_ddp_parity_main
    ARGS ${backend} TIMEOUT 120 LABELS gpu)
  set_tests_properties(gpu_ddp_parity_${backend}_2_ranks PROPERTIES SKIP_RETURN_CODE ${_ddp_skip_code})
endforeach()

# ddp_add_gpu_parity(<program> <source>): a parity program run under ddprun
# as Gloo with 2 ranks sharing a GPU, NCCL with 1 rank, and NCCL with 2 ranks
# when there are 2 GPUs (skipped otherwise, exit code 77).
function(ddp_add_gpu_parity program source)
  add_executable(${program} ${source})
  target_link_libraries(${program} PRIVATE ddp ddp_nccl_deps torch GTest::gtest Threads::Threads)
  target_include_directories(${program} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  ddp_use_test_pch(${program})
  string(REGEX REPLACE "_main$" "" stem ${program})
  foreach(config gloo:2 nccl:1 nccl:2)
    string(REPLACE ":" ";" parts ${config})
    list(GET parts 0 backend)
    list(GET parts 1 nproc)
    ddp_add_launched_test(${stem}_${backend}_${nproc}_ranks NPROC ${nproc} COMMAND ${program}
      ARGS ${backend} TIMEOUT 180 LABELS gpu)
    set_tests_properties(${stem}_${backend}_${nproc}_ranks PROPERTIES SKIP_RETURN_CODE ${_ddp_skip_code})
  endforeach()
endfunction()

# ZeroRedundancyOptimizer on CUDA parameters (stages 1 and 2, overlapped)
# against plain Adam on the CPU.
ddp_add_gpu_parity(gpu_zero_parity_main gpu/zero_cuda_parity_main.cpp)
# FullyShardedDataParallel on CUDA (every strategy, prefetch, a custom
# module, clip_grad_norm, bf16 mixed precision) against plain training on
# the CPU.
ddp_add_gpu_parity(gpu_fsdp_parity_main gpu/fsdp_cuda_parity_main.cpp)

# Checkpoints written on CUDA and read by PyTorch on CUDA and the CPU, and
# PyTorch's FSDP2 checkpoint read by ddp on CUDA (checkpoint_cuda.sh): with
# DDP_TEST_PYTHON's PyTorch, which must have CUDA; skipped without a device.
add_test(NAME checkpoint_cuda
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/checkpoint_cuda.sh $<TARGET_FILE:ddprun>
    $<TARGET_FILE:checkpoint_interop_main> ${DDP_TEST_PYTHON})
set_tests_properties(checkpoint_cuda PROPERTIES TIMEOUT 300 LABELS gpu SKIP_RETURN_CODE 77)
