// The direct reduce-scatter over MPI point-to-point messages; see
// mpi_reduce_scatter.h.

#include "comm/mpi/mpi_reduce_scatter.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

#include "comm/mpi/mpi_runtime.h"

namespace ddp::internal::mpi {

namespace {
// Not the ring allreduce's tags (1, 2); the worker runs one at a time anyway.
constexpr int kDirectReduceScatterTag = 3;
} // namespace

void direct_reduce_scatter(const void* input, const std::vector<int>& counts, void* output,
                           size_t element_size, MPI_Datatype datatype, const ReduceKernel& kernel,
                           MPI_Comm comm, int rank, int size) {
  const auto* bytes = static_cast<const uint8_t*>(input);
  std::vector<size_t> offset(static_cast<size_t>(size), 0); // in bytes
  for (int r = 1; r < size; ++r) {
    offset[r] = offset[r - 1] + static_cast<size_t>(counts[r - 1]) * element_size;
  }
  const int mine = counts[rank];
  const size_t mine_bytes = static_cast<size_t>(mine) * element_size;
  if (size == 1) {
    std::memcpy(output, bytes + offset[rank], mine_bytes);
    return;
  }
  const int first_peer = rank == 0 ? 1 : 0;
  // Slot of every peer after the first, in rank order.
  auto slot_of = [&](int peer) { return static_cast<size_t>((peer < rank ? peer : peer - 1) - 1); };
  // Not zeroed: every byte that is read is received first.
  const at::Tensor scratch_tensor =
      at::empty({mine > 0 ? static_cast<int64_t>(mine_bytes) * (size - 2) : 0}, at::kByte);
  auto* scratch = static_cast<uint8_t*>(scratch_tensor.data_ptr());
  std::vector<MPI_Request> requests;
  requests.reserve(static_cast<size_t>(2 * size));
  if (mine > 0) {
    requests.emplace_back();
    check_mpi(MPI_Irecv(output, mine, datatype, first_peer, kDirectReduceScatterTag, comm, &requests.back()),
              "reduce_scatter: MPI_Irecv");
    for (int peer = first_peer + 1; peer < size; ++peer) {
      if (peer != rank) {
        requests.emplace_back();
        check_mpi(MPI_Irecv(scratch + mine_bytes * slot_of(peer), mine, datatype, peer,
                            kDirectReduceScatterTag, comm, &requests.back()),
                  "reduce_scatter: MPI_Irecv");
      }
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank && counts[peer] > 0) {
      requests.emplace_back();
      // MPI 3 takes a const send buffer.
      check_mpi(MPI_Isend(bytes + offset[peer], counts[peer], datatype, peer, kDirectReduceScatterTag, comm,
                          &requests.back()),
                "reduce_scatter: MPI_Isend");
    }
  }
  check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
            "reduce_scatter: MPI_Waitall");
  if (mine == 0) {
    return;
  }
  kernel(output, bytes + offset[rank], output, static_cast<size_t>(mine));
  for (int peer = first_peer + 1; peer < size; ++peer) {
    if (peer != rank) {
      kernel(output, output, scratch + mine_bytes * slot_of(peer), static_cast<size_t>(mine));
    }
  }
}

} // namespace ddp::internal::mpi
