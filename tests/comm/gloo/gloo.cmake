# tests: comm/gloo
# ProcessGroup over Gloo: the collective sweep (comm/collective_sweep.h) on
# threads, failures in processes.
ddp_add_gtest(process_group_gloo_test SOURCES comm/gloo/process_group_gloo_test.cpp
  LIBS ddp_testing ddp_collective_sweep LABELS integration TIMEOUT 300)
ddp_add_gtest(process_group_failure_test SOURCES comm/gloo/process_group_failure_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 120)
# Which Gloo runs: the private copy inside libddp.so when LibTorch carries its
# own, else the shared libgloo (cmake/gloo.cmake).
ddp_add_gtest(gloo_origin_test SOURCES comm/gloo/gloo_origin_test.cpp LIBS ddp LABELS unit TIMEOUT 30)
if(DDP_GLOO_KIND STREQUAL "PRIVATE")
  target_compile_definitions(gloo_origin_test PRIVATE DDP_PRIVATE_GLOO=1)
  # And none of its symbols leaves libddp.so, defined or undefined.
  add_test(NAME gloo_symbols_hidden
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/check_gloo_symbols_hidden.sh
            ${CMAKE_NM} $<TARGET_FILE:ddp>)
  set_tests_properties(gloo_symbols_hidden PROPERTIES TIMEOUT 30 LABELS unit)
endif()
# What a failing or ending group says and does: peers named by rank, the
# missing rank named at rendezvous, destroy letting queued work finish.
ddp_add_gtest(gloo_reliability_test SOURCES comm/gloo/gloo_reliability_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 150)
# destroy_process_group() then init_process_group() 20 times in a row on one
# MASTER_PORT, 2 and 3 processes, a collective checked after each init.
ddp_add_gtest(gloo_reinit_test SOURCES comm/gloo/gloo_reinit_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 240)
# Allreduce of sparse COO tensors, ranks as threads; which groups support it.
ddp_add_gtest(sparse_allreduce_test SOURCES comm/gloo/sparse_allreduce_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 120)
# Ranks that call different collectives at the same point, in processes over
# real sockets: CollectiveMismatchError naming both calls on every rank, never
# a crash or a partial result (Note [Collective fingerprints]).
ddp_add_gtest(collective_mismatch_test SOURCES comm/gloo/collective_mismatch_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 120)
# Buffers in shared memory (Note [Shared buffers]): bits equal to the TCP
# path for every dtype and op on 2, 3 and 4 ranks, ranges, opt-outs, ranks
# killed while allocating and mid-allreduce (named errors, nothing left in
# /dev/shm).
ddp_add_gtest(gloo_shared_buffers_test SOURCES comm/gloo/gloo_shared_buffers_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 300)
# DDP's gradients read where they lie (Note [Gradients read where they
# lie]): bits equal to the TCP path's on 2, 3 and 4 ranks, fallbacks through
# the buffer, mixed callers, the opt-out, a rank killed in the middle, and
# DDP trained to the same bits with and without it.
ddp_add_gtest(gloo_cross_memory_test SOURCES comm/gloo/gloo_cross_memory_test.cpp
  LIBS ddp_testing LABELS integration TIMEOUT 300)
# The same across hosts made of network namespaces: shared within each
# host, TCP between them; uneven hosts all over TCP.
add_executable(shm_hosts_main comm/gloo/shm_hosts_main.cpp)
target_link_libraries(shm_hosts_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
ddp_use_test_pch(shm_hosts_main)
ddp_add_output_test(gloo_shm_hosts EXIT 0 REGEX "all layouts passed" TIMEOUT 240 LABELS integration
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/shm_hosts.sh $<TARGET_FILE:shm_hosts_main>)
