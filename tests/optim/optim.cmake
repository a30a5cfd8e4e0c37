# tests: optim
#
# ZeroRedundancyOptimizer. The partition rule alone (a pure function), and a
# program run as real processes under ddprun: parity with the plain
# optimizer on one process for 8 configurations, the shards, add_param_group,
# checkpoints in both directions and onto fewer ranks, and the errors.
ddp_add_gtest(zero_partition_test SOURCES optim/partition_test.cpp LIBS ddp LABELS unit TIMEOUT 60)

ddp_add_nn_program(zero_main optim/zero_main.cpp)
ddp_add_launched_test(zero_2_ranks NPROC 2 COMMAND zero_main CASES 42
  ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 120)
ddp_add_launched_test(zero_3_ranks NPROC 3 COMMAND zero_main CASES 42
  ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 120)
ddp_add_alone_test(zero_alone COMMAND zero_main CASES 39 ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 90)
if(DDP_HAVE_MPI)
  foreach(np 2 3)
    ddp_add_mpi_test(zero_mpi_${np}_ranks NP ${np} COMMAND zero_main CASES 42
      ARGS ${CMAKE_CURRENT_BINARY_DIR} TIMEOUT 180)
  endforeach()
endif()
