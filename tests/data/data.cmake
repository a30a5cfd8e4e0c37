# tests: data/data
#
# The sampler's unit tests link a fake default process group
# (fake_default_placement.cpp) in place of ddp_data_pg, so they need neither
# ddp_comm nor a running group. The parity test runs sampler_reference.py with
# DDP_TEST_PYTHON (tests/CMakeLists.txt; it fails, never skips, when that
# cannot import torch).
ddp_add_gtest(distributed_sampler_test
  SOURCES data/distributed_sampler_test.cpp data/fake_default_placement.cpp
  LIBS ddp_data ddp_internal
  LABELS integration TIMEOUT 60)
target_compile_definitions(distributed_sampler_test PRIVATE
  DDP_TEST_PYTHON="${DDP_TEST_PYTHON}"
  DDP_SAMPLER_REFERENCE_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/sampler_reference.py")

# The defaults read from a real default process group: forks two processes
# that rendezvous over env:// (init_process_group).
ddp_add_gtest(distributed_sampler_group_test
  SOURCES data/distributed_sampler_group_test.cpp
  LIBS ddp_data ddp_data_pg ddp_comm ddp_flight_recorder ddp_timeline ddp_plan ddp_comm_gloo ddp_stores ddp_internal
       ddp_test_ports
       # init.cpp creates ProcessGroupNCCL and ProcessGroupMPI when built.
       $<$<BOOL:${DDP_HAVE_NCCL}>:ddp_nccl>
       $<$<BOOL:${DDP_HAVE_MPI}>:ddp_comm_mpi>
  LABELS integration TIMEOUT 60)
