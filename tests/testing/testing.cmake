# Multi-rank test harness: threads over a HashStore, forked processes over a
# FileStore (tests/testing/multi_rank.h).
add_library(ddp_testing STATIC testing/multi_rank.cpp)
target_link_libraries(ddp_testing PUBLIC ddp torch Threads::Threads)
target_include_directories(ddp_testing PUBLIC ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
