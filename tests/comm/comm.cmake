# tests: comm
# init_process_group and the composite group; each backend's tests are in its
# own folder.
ddp_add_gtest(init_test SOURCES comm/init_test.cpp LIBS ddp_testing TIMEOUT 60)
# One group over several backends, routed by the device of the tensors.
ddp_add_gtest(process_group_composite_test SOURCES comm/process_group_composite_test.cpp
  LIBS ddp_testing TIMEOUT 60)

include(comm/gloo/gloo.cmake)
