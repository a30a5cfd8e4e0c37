#include "comm/mpi/mpi_shared_buffers.h"

#include <chrono>

#include "comm/mpi/mpi_engine.h"
#include "comm/mpi/mpi_runtime.h"

namespace ddp::internal::mpi {

void MpiCoordinator::max(int64_t* values, size_t count) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(count), MPI_INT64_T, MPI_MAX, comm_),
            "MPI_Allreduce (shared buffers)");
}

void MpiCoordinator::barrier() {
  const char* what = "MPI_Ibarrier (shared buffers)";
  MPI_Request done = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &done), what);
  poll_request(&done, std::chrono::steady_clock::time_point::max(), what);
}

} // namespace ddp::internal::mpi
