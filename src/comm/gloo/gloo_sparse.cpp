// The sparse allreduce: See Note [Sparse allreduce] in gloo_sparse.h.

#include "comm/gloo/gloo_sparse.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "comm/gloo/gloo_words.h"
#include "comm/sparse_layout.h"
#include "internal/check.h"

namespace ddp::internal {

namespace {

// Gathers each rank's `input` (1-D, contiguous, at most `max_count`
// elements) padded to `max_count`: rank r's lands at r * max_count.
at::Tensor allgather_padded(const std::shared_ptr<gloo::Context>& context, const at::Tensor& input,
                            int64_t max_count, uint32_t tag, std::chrono::milliseconds timeout) {
  auto gathered = at::zeros({context->size * max_count}, input.options());
  if (max_count == 0) {
    return gathered;
  }
  auto padded = at::zeros({max_count}, input.options());
  padded.narrow(0, 0, input.numel()).copy_(input);
  gloo::AllgatherOptions o(context);
  set_input(o, padded);
  set_output(o, gathered);
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::allgather(o);
  return gathered;
}

} // namespace

void sparse_allreduce(const std::shared_ptr<gloo::Context>& context, const at::Tensor& tensor,
                      const std::string& who, uint32_t tag, std::chrono::milliseconds timeout) {
  const int size = context->size;
  const SparseLayout layout(tensor);
  const auto& [local, dim, sparse_dim, nnz, sizes, dense_sizes, per_entry] = layout;
  const auto longs = at::TensorOptions(at::kLong);

  const auto header =
      allgather_padded(context, at::tensor(std::vector<int64_t>{dim, sparse_dim, nnz, per_entry}, longs),
                       4, tag, timeout);
  const auto* h = header.data_ptr<int64_t>();
  int64_t max_nnz = 0;
  int64_t total_nnz = 0;
  // Each rank against rank 0's, so that every rank raises the same error.
  for (int r = 0; r < size; ++r) {
    DDP_CHECK(h[4 * r] == h[0] && h[4 * r + 1] == h[1], who,
              ": the sparse tensors differ across ranks: rank ", r, "'s has ", h[4 * r],
              " dimensions of which ", h[4 * r + 1], " sparse, but rank 0's ", h[0], " of which ",
              h[1], "; every rank must pass a tensor of the same sizes");
    max_nnz = std::max(max_nnz, h[4 * r + 2]);
    total_nnz += h[4 * r + 2];
  }

  // Sizes, then indices (sparse_dim rows of nnz), per rank.
  const auto mine = at::cat({at::tensor(sizes, longs), local._indices().reshape({-1})});
  const int64_t index_slot = dim + sparse_dim * max_nnz;
  const auto indices = allgather_padded(context, mine, index_slot, tag, timeout);
  const c10::IntArrayRef rank0_sizes(indices.data_ptr<int64_t>(), static_cast<size_t>(dim));
  for (int r = 0; r < size; ++r) {
    const c10::IntArrayRef theirs(indices.data_ptr<int64_t>() + r * index_slot, static_cast<size_t>(dim));
    DDP_CHECK(theirs == rank0_sizes, who, ": the sparse tensors differ across ranks: rank ", r,
              "'s has sizes ", theirs, ", but rank 0's ", rank0_sizes,
              "; every rank must pass a tensor of the same sizes");
  }
  const int64_t value_slot = per_entry * max_nnz;
  const auto values =
      allgather_padded(context, local._values().contiguous().reshape({-1}), value_slot, tag, timeout);

  std::vector<at::Tensor> all_indices;
  std::vector<at::Tensor> all_values;
  auto value_shape = dense_sizes;
  for (int r = 0; r < size; ++r) {
    const int64_t n = h[4 * r + 2];
    all_indices.push_back(indices.narrow(0, r * index_slot + dim, sparse_dim * n).view({sparse_dim, n}));
    value_shape.insert(value_shape.begin(), n);
    all_values.push_back(values.narrow(0, r * value_slot, per_entry * n).view(value_shape));
    value_shape.erase(value_shape.begin());
  }
  DDP_INTERNAL_ASSERT(static_cast<int64_t>(at::cat(all_indices, 1).size(1)) == total_nnz);
  const auto sum = at::sparse_coo_tensor(at::cat(all_indices, 1), at::cat(all_values, 0), sizes,
                                         local.options())
                       .coalesce();
  tensor.copy_(sum);
}


} // namespace ddp::internal
