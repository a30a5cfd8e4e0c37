#pragma once

// Element-wise reduction kernels for the Gloo backend and MPI's own
// algorithms (private header).
//
// Gloo's algorithms are untyped: they move bytes and call a function
// `f(out, a, b, n)` to combine n elements. We supply that function for every
// (dtype, ReduceOp) pair LibTorch has, including Half and BFloat16 (which
// Gloo's built-in functions lack), and bool (where SUM is OR and PRODUCT is
// AND, as in torch.distributed).

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstddef>
#include <functional>

#include <ddp/comm/types.h>

namespace ddp::internal {

using ReduceKernel = std::function<void(void*, const void*, const void*, size_t)>;

// The kernel for `op` on `dtype`, or an empty function when the pair makes no
// sense (bitwise ops on floating types, AVG on integers). AVG maps to the SUM
// kernel: the caller divides afterwards.
ReduceKernel reduce_kernel(at::ScalarType dtype, ReduceOp op);

// True when `dtype` is one the backends move and reduce.
bool is_supported_dtype(at::ScalarType dtype);

} // namespace ddp::internal
