# The Gloo backend: ProcessGroupGloo, its rendezvous over a ddp Store, and the
# one header through which ddp reaches Gloo (gloo_api.h). Which Gloo it is
# built on is decided by cmake/gloo.cmake.
ddp_add_part(ddp_comm_gloo
  src/comm/gloo/process_group_gloo.cpp
  src/comm/gloo/gloo_exchange_allreduce.cpp
  src/comm/gloo/gloo_rendezvous.cpp
  src/comm/gloo/sigpipe_guard.cpp)
target_link_libraries(ddp_comm_gloo PUBLIC ${CMAKE_DL_LIBS})
target_precompile_headers(ddp_comm_gloo REUSE_FROM ddp_comm)
