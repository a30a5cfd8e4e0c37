# ProcessGroup over Gloo: collective sweeps on threads, failures in processes.
ddp_add_gtest(process_group_gloo_test SOURCES comm/process_group_gloo_test.cpp
  LIBS ddp_testing TIMEOUT 300)
ddp_add_gtest(process_group_failure_test SOURCES comm/process_group_failure_test.cpp
  LIBS ddp_testing TIMEOUT 120)
ddp_add_gtest(init_test SOURCES comm/init_test.cpp LIBS ddp_testing TIMEOUT 60)
