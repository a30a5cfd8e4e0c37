# Model averaging (PeriodicModelAverager, HierarchicalModelAverager) as real
# processes: the schedules, the subgroups' averages, PyTorch's checks.
ddp_add_nn_program(averaging_main model_averaging/averaging_main.cpp)
ddp_add_launched_test(averaging_2_ranks NPROC 2 COMMAND averaging_main CASES 4 TIMEOUT 60)
ddp_add_launched_test(averaging_3_ranks NPROC 3 COMMAND averaging_main CASES 4 TIMEOUT 60)
ddp_add_launched_test(averaging_4_ranks NPROC 4 COMMAND averaging_main CASES 4 TIMEOUT 90)
ddp_add_alone_test(averaging_alone COMMAND averaging_main CASES 4 TIMEOUT 60)
if(DDP_HAVE_MPI)
  ddp_add_mpi_test(averaging_mpi_2_ranks NP 2 COMMAND averaging_main CASES 4 TIMEOUT 60)
endif()
ddp_add_output_test(averaging_pytorch_parity EXIT 0 REGEX "^averaging_pytorch_parity: 9 of 9 checks passed$"
  TIMEOUT 180 LABELS integration
  COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/pytorch_averaging_parity.py
    --ddprun $<TARGET_FILE:ddprun> --ours $<TARGET_FILE:averaging_main> --python ${DDP_TEST_PYTHON})
