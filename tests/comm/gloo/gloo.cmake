# tests: comm/gloo
# ProcessGroup over Gloo: collective sweeps on threads, failures in processes.
ddp_add_gtest(process_group_gloo_test SOURCES comm/gloo/process_group_gloo_test.cpp
  LIBS ddp_testing TIMEOUT 300)
ddp_add_gtest(process_group_failure_test SOURCES comm/gloo/process_group_failure_test.cpp
  LIBS ddp_testing TIMEOUT 120)
# Which Gloo runs: the private copy inside libddp.so when LibTorch carries its
# own, else the shared libgloo (cmake/gloo.cmake).
ddp_add_gtest(gloo_origin_test SOURCES comm/gloo/gloo_origin_test.cpp LIBS ddp TIMEOUT 30)
if(DDP_GLOO_KIND STREQUAL "PRIVATE")
  target_compile_definitions(gloo_origin_test PRIVATE DDP_PRIVATE_GLOO=1)
  # And none of its symbols leaves libddp.so, defined or undefined.
  add_test(NAME gloo_symbols_hidden
    COMMAND sh -c "${CMAKE_NM} -DC $<TARGET_FILE:ddp> | grep 'gloo::' && { echo 'libddp.so exports or imports the Gloo symbols above'; exit 1; } || echo 'no Gloo symbol in the dynamic symbol table of libddp.so'")
  set_tests_properties(gloo_symbols_hidden PROPERTIES TIMEOUT 30)
endif()
