// The Reducer's sparse gradients (Note [Sparse gradients]): the empty
// gradient a rank sends for a sparse variable it has none for, and writing
// a reduced sparse (or, from a hook, dense) sum back into `param.grad()`.

#include "reducer/reducer.h"

#include <ATen/ATen.h>

#include <vector>

namespace ddp::internal {

// The gradient of a rank that has none for a sparse variable: no entries,
// sparse in the first dimension and dense in the others, like an
// Embedding's, so that every rank's matches (Note [Sparse gradients]).
at::Tensor empty_sparse_gradient(const at::Tensor& param) {
  std::vector<int64_t> value_sizes{0};
  for (int64_t d = 1; d < param.dim(); ++d) {
    value_sizes.push_back(param.size(d));
  }
  const auto options = param.options().requires_grad(false);
  return at::sparse_coo_tensor(at::empty({1, 0}, options.dtype(at::kLong)),
                               at::empty(value_sizes, options), param.sizes(),
                               options.layout(at::kSparse));
}

void Reducer::write_sparse_gradient(size_t index, const at::Tensor& reduced) {
  auto& param = const_cast<at::Tensor&>(parameters_[index]);
  at::Tensor& grad = param.mutable_grad();
  // A communication hook may return the sum dense.
  const at::Tensor result = reduced.is_sparse() ? reduced : reduced.reshape(param.sizes());
  if (grad.defined() && grad.is_same(result)) {
    return; // reduced in place
  }
  if (!grad.defined()) {
    grad = result;
  } else if (!grad.is_sparse()) {
    grad.copy_(result.is_sparse() ? result.to_dense() : result);
  } else if (result.is_sparse()) {
    grad.copy_(result);
  } else {
    grad = result;
  }
}

} // namespace ddp::internal
