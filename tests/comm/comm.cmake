# tests: comm
# init_process_group and the composite group; each backend's tests are in its
# own folder.
ddp_add_gtest(init_test SOURCES comm/init_test.cpp LIBS ddp_testing TIMEOUT 60)
# One group over several backends, routed by the device of the tensors.
ddp_add_gtest(process_group_composite_test SOURCES comm/process_group_composite_test.cpp
  LIBS ddp_testing TIMEOUT 60)

# The collective sweep's checks, one source that every backend's test runs
# (comm/collective_sweep.h).
add_library(ddp_collective_sweep STATIC comm/collective_sweep.cpp)
target_link_libraries(ddp_collective_sweep PUBLIC ddp torch GTest::gtest Threads::Threads)
target_include_directories(ddp_collective_sweep PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_precompile_headers(ddp_collective_sweep REUSE_FROM ddp_test_pch)
set_target_properties(ddp_collective_sweep PROPERTIES POSITION_INDEPENDENT_CODE OFF)

include(comm/gloo/gloo.cmake)
include(comm/mpi/mpi.cmake)
