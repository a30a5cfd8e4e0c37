#pragma once

// The MPI backend's side of the buffers in shared memory (private header):
// the small collectives they need (Note [Shared buffers] in
// comm/shm/shared_buffers.h), over the group's communicator.

#include <mpi.h>

#include "comm/shm/shared_buffers.h"

namespace ddp::internal::mpi {

// Valid for one task of the group's worker thread. Throws CommError when MPI
// fails. The multi-host form is not offered: the group shares buffers only
// when every rank is on one host.
class MpiCoordinator final : public shm::Coordinator {
 public:
  explicit MpiCoordinator(MPI_Comm comm) : comm_(comm) {}

  void max(int64_t* values, size_t count) override;
  // MPI_Ibarrier, waited for without spinning as in Note [MPI arrival wait]:
  // the rank's autograd thread may need the core.
  void barrier() override;

 private:
  MPI_Comm comm_;
};

} // namespace ddp::internal::mpi
