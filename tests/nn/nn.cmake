# tests: nn/nn
#
# DistributedDataParallel. A unit test of bucket assignment and one of the
# errors that need no group; the rest are programs run as real processes
# under ddprun, each checking many cases in one launch (every process start
# loads libtorch). The parity programs train from closed-form weights and
# data (nn/closed_form.h), so that every rank, the single-process reference
# and PyTorch start from the same values without exchanging files.
set(DDP_TEST_PYTHON "/usr/bin/python3" CACHE FILEPATH
    "Python interpreter with torch, for the parity tests against PyTorch")

# Bucket assignment, a pure function (src/reducer/bucket_assignment.h):
# hand-worked cases, rule sweeps, and 400 generated cases against PyTorch's
# own dist._compute_bucket_assignment_by_size (bucket_reference.py, run with
# DDP_TEST_PYTHON; it fails, never skips, when that cannot import torch).
ddp_add_gtest(bucket_assignment_test SOURCES nn/bucket_assignment_test.cpp LIBS ddp
  LABELS integration TIMEOUT 60)
target_compile_definitions(bucket_assignment_test PRIVATE
  DDP_TEST_PYTHON="${DDP_TEST_PYTHON}"
  DDP_BUCKET_REFERENCE_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/bucket_reference.py")

# Errors that need no running group: DDP before init_process_group.
ddp_add_gtest(distributed_data_parallel_test SOURCES nn/distributed_data_parallel_test.cpp
  LIBS ddp LABELS unit TIMEOUT 60)

# SyncBatchNorm and convert_sync_batchnorm in one process: layout, the
# conversion, checkpoints, the collectives it issues (a recording fake
# group), and uneven and empty ranks as threads over Gloo.
ddp_add_gtest(sync_batch_norm_test SOURCES nn/sync_batch_norm_test.cpp LIBS ddp_testing
  LABELS unit TIMEOUT 60)

# The PowerSGD hook on hand-made buckets over a fake group: collective
# order, errors, reconstruction, world-size division, error feedback.
ddp_add_gtest(powersgd_hook_test SOURCES nn/powersgd_hook_test.cpp LIBS ddp_testing LABELS unit TIMEOUT 60)
# A DDP program that the nn tests launch. GTest::gtest is not used by the
# programs, but its compile definitions must match the shared precompiled
# header's for the compiler to accept it (Torch's headers dominate compile
# time).
function(ddp_add_nn_program name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE ddp torch GTest::gtest Threads::Threads)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  ddp_use_test_pch(${name})
endfunction()

# Parity with one process (and no_sync, comm hooks, broadcast_buffers, the
# broadcast at construction, bucket layout and overlap, static_graph) on 2 and 3 ranks,
# and alone: a world of size 1 with no launcher must match plain training.
ddp_add_nn_program(ddp_parity_main nn/ddp_parity_main.cpp)
ddp_add_launched_test(ddp_parity_2_ranks NPROC 2 COMMAND ddp_parity_main CASES 28 TIMEOUT 90)
ddp_add_launched_test(ddp_parity_3_ranks NPROC 3 COMMAND ddp_parity_main CASES 28 TIMEOUT 90)
ddp_add_alone_test(ddp_parity_alone COMMAND ddp_parity_main CASES 28 TIMEOUT 60)

# SyncBatchNorm on 2 and 3 ranks (and alone) against BatchNorm in one
# process on the whole batch: uneven slices, an empty rank, 1d/2d/3d, a
# BatchNorm held as a custom module's member.
ddp_add_nn_program(ddp_sync_batch_norm_main nn/sync_batch_norm_main.cpp)
ddp_add_launched_test(ddp_sync_batch_norm_2_ranks NPROC 2 COMMAND ddp_sync_batch_norm_main
  CASES 6 TIMEOUT 90)
ddp_add_launched_test(ddp_sync_batch_norm_3_ranks NPROC 3 COMMAND ddp_sync_batch_norm_main
  CASES 6 TIMEOUT 90)
ddp_add_alone_test(ddp_sync_batch_norm_alone COMMAND ddp_sync_batch_norm_main CASES 6 TIMEOUT 60)

# Sparse gradients (Embedding and EmbeddingBag with sparse(true)): parity
# with one process, no_sync, hooks, unused tables, layout and Join, on 2 and
# 3 ranks, and alone.
ddp_add_nn_program(ddp_sparse_main nn/ddp_sparse_main.cpp)
ddp_add_launched_test(ddp_sparse_2_ranks NPROC 2 COMMAND ddp_sparse_main CASES 9 TIMEOUT 90)
ddp_add_launched_test(ddp_sparse_3_ranks NPROC 3 COMMAND ddp_sparse_main CASES 9 TIMEOUT 90)
ddp_add_alone_test(ddp_sparse_alone COMMAND ddp_sparse_main CASES 9 TIMEOUT 60)

# The PowerSGD communication hook on 2 and 3 ranks (and alone) against one
# process running it on the whole batch; its bytes in closed form.
ddp_add_nn_program(ddp_powersgd_main nn/powersgd_main.cpp)
ddp_add_launched_test(ddp_powersgd_2_ranks NPROC 2 COMMAND ddp_powersgd_main CASES 7 TIMEOUT 90)
ddp_add_launched_test(ddp_powersgd_3_ranks NPROC 3 COMMAND ddp_powersgd_main CASES 7 TIMEOUT 90)
ddp_add_alone_test(ddp_powersgd_alone COMMAND ddp_powersgd_main CASES 7 TIMEOUT 60)
# Stateful hooks (PowerSGD, batched PowerSGD, post-local SGD) across a
# checkpoint: resumed == uninterrupted, on 2 and 3 ranks and on MPI; the
# refusals of a state that does not fit.
ddp_add_nn_program(ddp_hook_resume_main nn/hook_resume_main.cpp)
ddp_add_launched_test(ddp_hook_resume_2_ranks NPROC 2 COMMAND ddp_hook_resume_main CASES 7
  ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 90)
ddp_add_launched_test(ddp_hook_resume_3_ranks NPROC 3 COMMAND ddp_hook_resume_main CASES 7
  ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 90)
if(DDP_HAVE_MPI)
  ddp_add_mpi_test(ddp_hook_resume_mpi_2_ranks NP 2 COMMAND ddp_hook_resume_main CASES 7
    ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 90)
endif()
# Errors on every rank, no hang: models that differ across ranks, a
# parameter without a gradient when find_unused_parameters is off, ranks
# that disagree on no_sync() under Join (on 2 and 3 ranks), and Join's
# throw_on_early_termination.
ddp_add_nn_program(ddp_errors_main nn/ddp_errors_main.cpp)
ddp_add_launched_test(ddp_error_models_differ NPROC 2 COMMAND ddp_errors_main
  ARGS models-differ TIMEOUT 60)
ddp_add_launched_test(ddp_error_unused_parameter NPROC 2 COMMAND ddp_errors_main
  ARGS unused-parameter TIMEOUT 60)
ddp_add_launched_test(ddp_error_join_disagree_2_ranks NPROC 2 COMMAND ddp_errors_main
  ARGS join-disagree TIMEOUT 60)
ddp_add_launched_test(ddp_error_join_disagree_3_ranks NPROC 3 COMMAND ddp_errors_main
  ARGS join-disagree TIMEOUT 60)
ddp_add_launched_test(ddp_error_join_throw_3_ranks NPROC 3 COMMAND ddp_errors_main
  ARGS join-throw TIMEOUT 60)
# static_graph: a graph that changes after the first iteration (a layer
# that starts or stops being used) fails on every rank, on 2 and 3 ranks;
# when it changes on rank 0 only, the others fail within the group's
# timeout; without static_graph, a layer whose hook fires twice in one
# backward (reentrant checkpoints) fails as PyTorch's does.
ddp_add_launched_test(ddp_error_static_graph_changed_2_ranks NPROC 2 COMMAND ddp_errors_main
  ARGS static-graph-changed TIMEOUT 60)
ddp_add_launched_test(ddp_error_static_graph_changed_3_ranks NPROC 3 COMMAND ddp_errors_main
  ARGS static-graph-changed TIMEOUT 60)
ddp_add_launched_test(ddp_error_static_graph_changed_one_rank_2_ranks NPROC 2
  COMMAND ddp_errors_main ARGS static-graph-changed-one-rank TIMEOUT 60)
ddp_add_launched_test(ddp_error_static_graph_changed_one_rank_3_ranks NPROC 3
  COMMAND ddp_errors_main ARGS static-graph-changed-one-rank TIMEOUT 60)
ddp_add_launched_test(ddp_error_reused_parameter NPROC 2 COMMAND ddp_errors_main
  ARGS reused-parameter TIMEOUT 60)

# Join with uneven inputs, and checkpoints: save on all ranks, load back,
# and load the file in a plain LibTorch process without ddp
# (ddp_checkpoint_plain_load, which does not link ddp).
add_executable(ddp_checkpoint_plain_load nn/checkpoint_plain_load_main.cpp)
target_link_libraries(ddp_checkpoint_plain_load PRIVATE torch GTest::gtest) # gtest: see above
target_include_directories(ddp_checkpoint_plain_load PRIVATE ${PROJECT_SOURCE_DIR}/tests)
ddp_use_test_pch(ddp_checkpoint_plain_load)
ddp_add_nn_program(ddp_join_checkpoint_main nn/ddp_join_checkpoint_main.cpp)
ddp_add_launched_test(ddp_join_checkpoint_2_ranks NPROC 2 COMMAND ddp_join_checkpoint_main CASES 3
  ARGS ${CMAKE_CURRENT_BINARY_DIR} $<TARGET_FILE:ddp_checkpoint_plain_load> TIMEOUT 90)
ddp_add_launched_test(ddp_join_checkpoint_3_ranks NPROC 3 COMMAND ddp_join_checkpoint_main CASES 3
  ARGS ${CMAKE_CURRENT_BINARY_DIR} $<TARGET_FILE:ddp_checkpoint_plain_load> TIMEOUT 90)

# Checkpoints and crashes: under ddprun with 2 ranks, rank 0 is killed at
# each point of a save (DDP_TEST_CHECKPOINT_CRASH_AT), and what it leaves
# must load as a matching pair, the old or the new; mismatched, incomplete
# and old-format pairs (ddp_checkpoint_crash_main errors). 17 launches.
ddp_add_nn_program(ddp_checkpoint_crash_main nn/checkpoint_crash_main.cpp)
ddp_add_gtest(checkpoint_crash_test SOURCES nn/checkpoint_crash_test.cpp TIMEOUT 400
  LABELS integration)
target_compile_definitions(checkpoint_crash_test PRIVATE
  DDPRUN_PATH="$<TARGET_FILE:ddprun>"
  DDP_CHECKPOINT_CRASH_MAIN_PATH="$<TARGET_FILE:ddp_checkpoint_crash_main>")
add_dependencies(checkpoint_crash_test ddprun ddp_checkpoint_crash_main)

# Parity with PyTorch's own DistributedDataParallel: the driver runs our
# program and pytorch_ddp_reference.py under ddprun with 2 (and 3) ranks
# each and compares the final parameters, buffers and defined gradients, and
# that both refuse a module with nothing to train. Fails (does not skip)
# without torch. Each of the two runs has 110 s (RUN_TIMEOUT_S in the driver).
ddp_add_nn_program(ddp_pytorch_parity_main nn/pytorch_parity_main.cpp)
foreach(nproc 2 3)
  if(nproc EQUAL 2)
    set(_ddp_parity_test ddp_pytorch_parity)
  else()
    set(_ddp_parity_test ddp_pytorch_parity_${nproc}_ranks)
  endif()
  add_test(NAME ${_ddp_parity_test}
    COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/pytorch_parity_driver.py
      --ddprun $<TARGET_FILE:ddprun>
      --ours $<TARGET_FILE:ddp_pytorch_parity_main>
      --python ${DDP_TEST_PYTHON}
      --reference ${CMAKE_CURRENT_LIST_DIR}/pytorch_ddp_reference.py
      --workdir ${CMAKE_CURRENT_BINARY_DIR}
      --nproc ${nproc})
  set_tests_properties(${_ddp_parity_test} PROPERTIES TIMEOUT 240 LABELS "integration")
endforeach()

# Modules as PyTorch's C++ examples write them (`struct Net :
# torch::nn::Module`, std::make_shared or by value) under DDP and FSDP; a
# FsdpUnit model's full state in the names of the model without units; FSDP
# refusing initial values that differ across ranks.
ddp_add_nn_program(plain_module_main nn/plain_module_main.cpp)
ddp_add_launched_test(plain_module_2_ranks NPROC 2 COMMAND plain_module_main CASES 5 TIMEOUT 90)
ddp_add_alone_test(plain_module_alone COMMAND plain_module_main CASES 5 TIMEOUT 60)

# ddp::Checkpointed in one process (activation checkpointing).
ddp_add_gtest(activation_checkpoint_test SOURCES nn/activation_checkpoint_test.cpp LIBS ddp LABELS unit TIMEOUT 60)
