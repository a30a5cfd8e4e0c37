# The MPI backend: ProcessGroupMPI, its engine (worker, watchdog,
# point-to-point), MPI's process-wide state and the dtype/op mapping. Built
# only when cmake/mpi.cmake found an MPI (DDP_HAVE_MPI).
if(DDP_HAVE_MPI)
  ddp_add_part(ddp_comm_mpi
    src/comm/mpi/mpi_runtime.cpp
    src/comm/mpi/mpi_types.cpp
    src/comm/mpi/mpi_engine.cpp
    src/comm/mpi/mpi_ring.cpp
    src/comm/mpi/mpi_shared_buffers.cpp
    src/comm/mpi/mpi_sparse.cpp
    src/comm/mpi/process_group_mpi.cpp)
  target_link_libraries(ddp_comm_mpi PUBLIC ddp_mpi_deps)
  target_precompile_headers(ddp_comm_mpi PRIVATE <ATen/ATen.h>)
  # init.cpp creates a ProcessGroupMPI for Backend::kMpi and DDP_BACKEND=mpi.
  target_compile_definitions(ddp_comm PRIVATE DDP_WITH_MPI=1)
endif()
