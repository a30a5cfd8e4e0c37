# The Gloo backend: ProcessGroupGloo (its collectives in process_group_gloo.cpp,
# its task queue, workers and monitor in process_group_gloo_impl.h), the
# sparse allreduce, send/recv, the one reading of Gloo's error messages
# (gloo_errors.h), its rendezvous over a ddp Store, and the one header through
# which ddp reaches Gloo (gloo_api.h). Which Gloo it is
# built on is decided by cmake/gloo.cmake.
ddp_add_part(ddp_comm_gloo
  src/comm/gloo/process_group_gloo.cpp
  src/comm/gloo/gloo_errors.cpp
  src/comm/gloo/gloo_point_to_point.cpp
  src/comm/gloo/gloo_sparse.cpp
  src/comm/gloo/gloo_exchange_allreduce.cpp
  src/comm/gloo/gloo_shared_buffers.cpp
  src/comm/gloo/gloo_rendezvous.cpp
  src/comm/gloo/silent_peers.cpp
  src/comm/gloo/sigpipe_guard.cpp)
# Only this part sees Gloo's headers and, with a private Gloo, its
# DDP_PRIVATE_GLOO definition: the other parts' precompiled headers stay valid
# for the examples and tests, which never see either.
target_link_libraries(ddp_comm_gloo PUBLIC ddp_gloo ${CMAKE_DL_LIBS})
target_precompile_headers(ddp_comm_gloo REUSE_FROM ddp_comm)
