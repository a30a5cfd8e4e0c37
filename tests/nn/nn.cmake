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

# Bucket assignment, a pure function (src/reducer/bucket_assignment.h).
ddp_add_gtest(bucket_assignment_test SOURCES nn/bucket_assignment_test.cpp LIBS ddp
  TIMEOUT 30)

# Errors that need no running group: DDP before init_process_group.
ddp_add_gtest(distributed_data_parallel_test SOURCES nn/distributed_data_parallel_test.cpp
  LIBS ddp TIMEOUT 60)

# A DDP program that the nn tests launch. GTest::gtest is not used by the
# programs, but its compile definitions must match the shared precompiled
# header's for the compiler to accept it (Torch's headers dominate compile
# time).
function(ddp_add_nn_program name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE ddp torch GTest::gtest Threads::Threads)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_precompile_headers(${name} REUSE_FROM ddp_test_pch)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
endfunction()

# Parity with one process (and no_sync, comm hooks, broadcast_buffers, the
# broadcast at construction, bucket layout and overlap) on 2 and 3 ranks,
# and alone: a world of size 1 with no launcher must match plain training.
ddp_add_nn_program(ddp_parity_main nn/ddp_parity_main.cpp)
ddp_add_launched_test(ddp_parity_2_ranks NPROC 2 COMMAND ddp_parity_main TIMEOUT 90)
ddp_add_launched_test(ddp_parity_3_ranks NPROC 3 COMMAND ddp_parity_main TIMEOUT 90)
add_test(NAME ddp_parity_alone COMMAND ddp_parity_main)
set_tests_properties(ddp_parity_alone PROPERTIES TIMEOUT 60
  ENVIRONMENT_MODIFICATION "RANK=unset:;WORLD_SIZE=unset:;MASTER_ADDR=unset:;MASTER_PORT=unset:")

# Errors on every rank, no hang: models that differ across ranks, and a
# parameter without a gradient when find_unused_parameters is off.
ddp_add_nn_program(ddp_errors_main nn/ddp_errors_main.cpp)
ddp_add_launched_test(ddp_error_models_differ NPROC 2 COMMAND ddp_errors_main
  ARGS models-differ TIMEOUT 60)
ddp_add_launched_test(ddp_error_unused_parameter NPROC 2 COMMAND ddp_errors_main
  ARGS unused-parameter TIMEOUT 60)

# Join with uneven inputs, and checkpoints: save on all ranks, load back,
# and load the file in a plain LibTorch process without ddp
# (ddp_checkpoint_plain_load, which does not link ddp).
add_executable(ddp_checkpoint_plain_load nn/checkpoint_plain_load_main.cpp)
target_link_libraries(ddp_checkpoint_plain_load PRIVATE torch GTest::gtest) # gtest: see above
target_include_directories(ddp_checkpoint_plain_load PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_precompile_headers(ddp_checkpoint_plain_load REUSE_FROM ddp_test_pch)
set_target_properties(ddp_checkpoint_plain_load PROPERTIES POSITION_INDEPENDENT_CODE OFF)
ddp_add_nn_program(ddp_join_checkpoint_main nn/ddp_join_checkpoint_main.cpp)
ddp_add_launched_test(ddp_join_checkpoint_2_ranks NPROC 2 COMMAND ddp_join_checkpoint_main
  ARGS ${CMAKE_CURRENT_BINARY_DIR} $<TARGET_FILE:ddp_checkpoint_plain_load> TIMEOUT 90)
ddp_add_launched_test(ddp_join_checkpoint_3_ranks NPROC 3 COMMAND ddp_join_checkpoint_main
  ARGS ${CMAKE_CURRENT_BINARY_DIR} $<TARGET_FILE:ddp_checkpoint_plain_load> TIMEOUT 90)

# Parity with PyTorch's own DistributedDataParallel: the driver runs our
# program and pytorch_ddp_reference.py under ddprun with 2 ranks each and
# compares the final parameters. Fails (does not skip) without torch.
ddp_add_nn_program(ddp_pytorch_parity_main nn/pytorch_parity_main.cpp)
add_test(NAME ddp_pytorch_parity
  COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/pytorch_parity_driver.py
    --ddprun $<TARGET_FILE:ddprun>
    --ours $<TARGET_FILE:ddp_pytorch_parity_main>
    --python ${DDP_TEST_PYTHON}
    --reference ${CMAKE_CURRENT_LIST_DIR}/pytorch_ddp_reference.py
    --workdir ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(ddp_pytorch_parity PROPERTIES TIMEOUT 180 LABELS "integration")
