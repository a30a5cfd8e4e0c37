#include "comm/reduce_kernels.h"

#include <cstdint>

namespace ddp::internal {
namespace {

struct SumOp {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a + b);
  }
};
struct ProductOp {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a * b);
  }
};
struct MinOp {
  template <typename T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct BandOp {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a & b);
  }
};
struct BorOp {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a | b);
  }
};
struct BxorOp {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a ^ b);
  }
};

template <typename T, typename Op>
void apply(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  const Op op;
  for (size_t i = 0; i < n; ++i) {
    o[i] = op(x[i], y[i]);
  }
}

template <typename T>
ReduceKernel arithmetic_kernel(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &apply<T, SumOp>;
    case ReduceOp::kProduct:
      return &apply<T, ProductOp>;
    case ReduceOp::kMin:
      return &apply<T, MinOp>;
    case ReduceOp::kMax:
      return &apply<T, MaxOp>;
    default:
      return {};
  }
}

template <typename T>
ReduceKernel integer_kernel(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAvg:
      return {};
    case ReduceOp::kBand:
      return &apply<T, BandOp>;
    case ReduceOp::kBor:
      return &apply<T, BorOp>;
    case ReduceOp::kBxor:
      return &apply<T, BxorOp>;
    default:
      return arithmetic_kernel<T>(op);
  }
}

// bool is stored as one byte holding 0 or 1; combine as logic.
ReduceKernel bool_kernel(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return &apply<uint8_t, BorOp>;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return &apply<uint8_t, BandOp>;
    case ReduceOp::kBxor:
      return &apply<uint8_t, BxorOp>;
    case ReduceOp::kAvg:
      return {};
  }
  return {};
}

} // namespace

ReduceKernel reduce_kernel(at::ScalarType dtype, ReduceOp op) {
  switch (dtype) {
    case at::kFloat:
      return arithmetic_kernel<float>(op);
    case at::kDouble:
      return arithmetic_kernel<double>(op);
    case at::kHalf:
      return arithmetic_kernel<c10::Half>(op);
    case at::kBFloat16:
      return arithmetic_kernel<c10::BFloat16>(op);
    case at::kChar:
      return integer_kernel<int8_t>(op);
    case at::kByte:
      return integer_kernel<uint8_t>(op);
    case at::kShort:
      return integer_kernel<int16_t>(op);
    case at::kInt:
      return integer_kernel<int32_t>(op);
    case at::kLong:
      return integer_kernel<int64_t>(op);
    case at::kBool:
      return bool_kernel(op);
    default:
      return {};
  }
}

bool is_supported_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

} // namespace ddp::internal
