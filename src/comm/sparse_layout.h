#pragma once

// What the backends' sparse allreduces (Note [Sparse allreduce] for Gloo,
// Note [Sparse allreduce over MPI]) read off a sparse tensor before they
// exchange it (private header).

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace ddp::internal {

struct SparseLayout {
  // The tensor coalesced, on the CPU: its indices and values are what is sent.
  at::Tensor local;
  int64_t dim = 0;
  int64_t sparse_dim = 0;
  int64_t nnz = 0;
  std::vector<int64_t> sizes;
  // The sizes of one entry (the dense dimensions), and its element count.
  std::vector<int64_t> dense_sizes;
  int64_t per_entry = 1;

  explicit SparseLayout(const at::Tensor& tensor)
      : local(tensor.to(at::kCPU).coalesce()),
        dim(local.dim()),
        sparse_dim(local.sparse_dim()),
        nnz(local._nnz()),
        sizes(local.sizes().vec()),
        dense_sizes(sizes.begin() + sparse_dim, sizes.end()) {
    for (int64_t s : dense_sizes) {
      per_entry *= s;
    }
  }
};

} // namespace ddp::internal
