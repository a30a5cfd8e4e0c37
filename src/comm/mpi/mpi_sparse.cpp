// Note [Sparse allreduce over MPI]
// MPI has no sparse collective either (see Note [Sparse allreduce] for
// Gloo's). Here it takes three collectives on the group's communicator:
// MPI_Allgather of a header per rank (dimensions, sparse dimensions,
// entries, elements per entry, then the sizes); MPI_Allgatherv of every
// rank's indices; MPI_Allgatherv of every rank's values. Unlike Gloo's
// allgather, MPI_Allgatherv takes a count per rank, so nothing is padded.
// Each rank then concatenates the entries in rank order and coalesces them:
// every rank ends with the same sum. A rank whose tensor differs in sizes is
// seen by all ranks in the header, and all raise the same error before the
// next collective, so the group stays usable. CUDA tensors go through host
// memory.

#include "comm/mpi/mpi_sparse.h"

#include "comm/sparse_layout.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "comm/mpi/mpi_runtime.h"
#include "comm/mpi/mpi_types.h"
#include "internal/check.h"

namespace ddp::internal::mpi {

namespace {

// The header's length for a tensor of `dim` dimensions: 4 fields, then the
// sizes, padded to kMaxDims so that MPI_Allgather moves one count.
constexpr int kMaxDims = 16;
constexpr int kHeader = 4 + kMaxDims;

// Gathers every rank's `mine` (1-D, contiguous, `counts[rank]` elements) into
// one tensor, rank r's at the sum of the counts before it.
at::Tensor allgatherv(const at::Tensor& mine, const std::vector<int64_t>& counts, MPI_Comm comm,
                      const std::string& who) {
  std::vector<int> recv_counts;
  std::vector<int> displacements;
  int64_t total = 0;
  for (int64_t count : counts) {
    DDP_CHECK(total + count <= INT_MAX, who,
              ": the sparse tensors hold more than INT_MAX elements in all, more than one MPI "
              "call moves; split the tensor");
    displacements.push_back(static_cast<int>(total));
    recv_counts.push_back(static_cast<int>(count));
    total += count;
  }
  auto gathered = at::empty({total}, mine.options());
  const MPI_Datatype datatype = datatype_of(mine.scalar_type());
  check_mpi(MPI_Allgatherv(mine.data_ptr(), static_cast<int>(mine.numel()), datatype,
                           gathered.data_ptr(), recv_counts.data(), displacements.data(), datatype,
                           comm),
            who + ": MPI_Allgatherv");
  return gathered;
}

} // namespace

void sparse_allreduce(const at::Tensor& tensor, MPI_Comm comm, const std::string& who) {
  int size = 0;
  check_mpi(MPI_Comm_size(comm, &size), who + ": MPI_Comm_size");
  const SparseLayout layout(tensor);
  const auto& [local, dim, sparse_dim, nnz, sizes, dense_sizes, per_entry] = layout;
  DDP_CHECK(dim <= kMaxDims, who, ": a sparse tensor of ", dim,
            " dimensions; the MPI backend reduces sparse tensors of at most ", kMaxDims);

  std::vector<int64_t> header(kHeader, -1);
  header[0] = dim;
  header[1] = sparse_dim;
  header[2] = nnz;
  header[3] = per_entry;
  std::copy(sizes.begin(), sizes.end(), header.begin() + 4);
  std::vector<int64_t> headers(static_cast<size_t>(kHeader) * size);
  check_mpi(MPI_Allgather(header.data(), kHeader, MPI_INT64_T, headers.data(), kHeader, MPI_INT64_T,
                          comm),
            who + ": MPI_Allgather");
  // Each rank against rank 0's, so that every rank raises the same error.
  const c10::IntArrayRef rank0(headers.data(), static_cast<size_t>(kHeader));
  std::vector<int64_t> index_counts;
  std::vector<int64_t> value_counts;
  for (int r = 0; r < size; ++r) {
    const c10::IntArrayRef theirs(headers.data() + static_cast<size_t>(kHeader) * r,
                                  static_cast<size_t>(kHeader));
    DDP_CHECK(theirs[0] == rank0[0] && theirs[1] == rank0[1], who,
              ": the sparse tensors differ across ranks: rank ", r, "'s has ", theirs[0],
              " dimensions of which ", theirs[1], " sparse, but rank 0's ", rank0[0], " of which ",
              rank0[1], "; every rank must pass a tensor of the same sizes");
    DDP_CHECK(theirs.slice(4, dim) == rank0.slice(4, dim), who,
              ": the sparse tensors differ across ranks: rank ", r, "'s has sizes ",
              theirs.slice(4, dim), ", but rank 0's ", rank0.slice(4, dim),
              "; every rank must pass a tensor of the same sizes");
    index_counts.push_back(sparse_dim * theirs[2]);
    value_counts.push_back(per_entry * theirs[2]);
  }

  // Indices are gathered transposed (entry by entry), so that rank r's
  // entries are one contiguous run.
  const auto indices =
      allgatherv(local._indices().t().contiguous().reshape({-1}), index_counts, comm, who);
  const auto values = allgatherv(local._values().contiguous().reshape({-1}), value_counts, comm, who);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    total += headers[static_cast<size_t>(kHeader) * r + 2];
  }
  auto value_shape = dense_sizes;
  value_shape.insert(value_shape.begin(), total);
  const auto sum = at::sparse_coo_tensor(indices.view({total, sparse_dim}).t(),
                                         values.view(value_shape), sizes, local.options())
                       .coalesce();
  tensor.copy_(sum);
}

} // namespace ddp::internal::mpi
