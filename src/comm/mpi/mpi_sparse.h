#pragma once

// The MPI backend's sparse allreduce (private header). See Note [Sparse
// allreduce over MPI] in mpi_sparse.cpp.

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <string>

namespace ddp::internal::mpi {

// Replaces the sparse COO `tensor`'s indices and values with the coalesced
// sum of every rank's tensor on `comm`. Runs on the engine's worker thread;
// `who` is "[rank R/W] allreduce #N". Throws c10::Error, on every rank
// alike, when the ranks' tensors differ in sizes; CommError when MPI fails.
void sparse_allreduce(const at::Tensor& tensor, MPI_Comm comm, const std::string& who);

} // namespace ddp::internal::mpi
