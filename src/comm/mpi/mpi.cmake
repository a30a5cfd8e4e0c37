# The MPI backend: ProcessGroupMPI, its engine (worker, watchdog,
# point-to-point), MPI's process-wide state and the dtype/op mapping. Built
# only when cmake/mpi.cmake found an MPI (DDP_HAVE_MPI).
if(DDP_HAVE_MPI)
  ddp_add_part(ddp_comm_mpi
    src/comm/mpi/mpi_runtime.cpp
    src/comm/mpi/mpi_types.cpp
    src/comm/mpi/mpi_engine.cpp
    src/comm/mpi/mpi_ring.cpp
    src/comm/mpi/mpi_reduce_scatter.cpp
    src/comm/mpi/mpi_shared_buffers.cpp
    src/comm/mpi/mpi_sparse.cpp
    src/comm/mpi/mpi_packing.cpp
    src/comm/mpi/process_group_mpi.cpp)
  target_link_libraries(ddp_comm_mpi PUBLIC ddp_mpi_deps)
  target_precompile_headers(ddp_comm_mpi REUSE_FROM ddp_comm)
  # init.cpp creates a ProcessGroupMPI for Backend::kMpi and DDP_BACKEND=mpi.
  # On that file alone: a definition on the whole target would go into
  # ddp_comm's precompiled header, which the backends' parts, built without
  # it, then could not use.
  set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/comm/init.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS DDP_WITH_MPI=1)
endif()
