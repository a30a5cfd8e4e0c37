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
