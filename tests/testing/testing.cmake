# free_port, alone: no Torch, so that a test of some of the library's parts
# links it without the rest (tests/testing/free_port.h).
add_library(ddp_test_ports STATIC testing/free_port.cpp)
target_include_directories(ddp_test_ports PUBLIC ${PROJECT_SOURCE_DIR}/tests)
# Multi-rank test harness: threads over a HashStore, forked processes over a
# FileStore (tests/testing/multi_rank.h).
add_library(ddp_testing STATIC testing/multi_rank.cpp)
target_link_libraries(ddp_testing PUBLIC ddp_test_ports ddp torch Threads::Threads)
target_include_directories(ddp_testing PUBLIC ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
