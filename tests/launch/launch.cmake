# tests: launch/launch
# ddprun. The in-process tests (parser, line splitter) link the launcher's
# objects; ddprun_test runs the real binary, with ddprun_test_writer and
# ddprun_test_port_rank (the restart tests) as ranks.
ddp_add_gtest(ddprun_options_test
  SOURCES launch/options_test.cpp launch/output_test.cpp $<TARGET_OBJECTS:ddprun_objects>
  LABELS unit TIMEOUT 30)

add_executable(ddprun_test_writer launch/chunky_writer.cpp)
add_executable(ddprun_test_port_rank launch/port_rank.cpp)

ddp_add_gtest(ddprun_test
  SOURCES launch/ddprun_test.cpp
  LABELS integration TIMEOUT 120)
target_compile_definitions(ddprun_test PRIVATE
  DDPRUN_PATH="$<TARGET_FILE:ddprun>"
  DDPRUN_TEST_WRITER_PATH="$<TARGET_FILE:ddprun_test_writer>"
  DDPRUN_TEST_PORT_RANK_PATH="$<TARGET_FILE:ddprun_test_port_rank>")
add_dependencies(ddprun_test ddprun ddprun_test_writer ddprun_test_port_rank)

# The launchers users run ddp under, for real: a Slurm cluster of Debian's
# daemons started by the test itself (one node, then two in network
# namespaces), with srun, sbatch, salloc and mpirun inside them
# (slurm/slurm_cases.sh says which cases). The script exits 0 only when
# every case it ran passed, and 77 (skipped) only where Slurm is not
# installed or the test is not root; where the two-node cluster cannot be
# made it says why and runs the one-node cases.
if(DDP_HAVE_MPI)
  add_test(NAME slurm_cases
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/slurm/slurm_cases.sh $<TARGET_FILE:toy_model>
      $<TARGET_FILE:mnist_train> ${DDP_TEST_PYTHON} ${MPIEXEC_EXECUTABLE})
  set_tests_properties(slurm_cases PROPERTIES TIMEOUT 400 LABELS integration SKIP_RETURN_CODE 77)
endif()

# The environment Kubeflow's PyTorchJob gives each pod (pytorchjob_env.sh).
add_test(NAME pytorchjob_env
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/pytorchjob_env.sh $<TARGET_FILE:toy_model> ${DDP_TEST_PYTHON})
set_tests_properties(pytorchjob_env PROPERTIES TIMEOUT 60 LABELS integration)
