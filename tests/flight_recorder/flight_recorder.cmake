# tests: flight recorder. The dump reader, and induced faults on 2 ranks, Gloo and (when built
# with it) MPI, each dump read back by `ddprun --analyze`
# (flight_recorder_cases.sh says which).
ddp_add_gtest(flight_recorder_json_test
  SOURCES flight_recorder/json_test.cpp $<TARGET_OBJECTS:ddprun_objects>
  LABELS unit TIMEOUT 30)
# The analyzer's "first failure" line from hand-written dumps and accounts.
ddp_add_gtest(flight_recorder_first_failure_test
  SOURCES flight_recorder/first_failure_test.cpp $<TARGET_OBJECTS:ddprun_objects>
  LABELS unit TIMEOUT 30)
add_executable(flight_recorder_main flight_recorder/flight_recorder_main.cpp)
target_link_libraries(flight_recorder_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
ddp_use_test_pch(flight_recorder_main)
if(DDP_HAVE_MPI)
  set(_ddp_fr_mpirun ${MPIEXEC_EXECUTABLE})
  set(_ddp_fr_cases 32)
else()
  set(_ddp_fr_mpirun "")
  set(_ddp_fr_cases 30)
endif()
ddp_add_output_test(flight_recorder_cases EXIT 0
  REGEX "^flight_recorder_cases: ${_ddp_fr_cases} of ${_ddp_fr_cases} checks passed$"
  TIMEOUT 180 LABELS integration
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/flight_recorder_cases.sh $<TARGET_FILE:flight_recorder_main>
    $<TARGET_FILE:ddprun> ${DDP_TEST_PYTHON} ${_ddp_fr_mpirun})
