#include "comm/mpi/mpi_types.h"

#include <array>
#include <mutex>
#include <utility>

#include "comm/reduce_kernels.h"
#include "internal/check.h"

namespace ddp::internal::mpi {

namespace {

// The dtypes that need a user-defined operation, and their index in the
// table below.
constexpr std::array<at::ScalarType, 3> kUserDtypes = {at::kHalf, at::kBFloat16, at::kBool};
constexpr size_t kOps = 8; // ReduceOp's enumerators, kSum to kBxor

// MPI calls a user function with no context pointer, so each (dtype, op)
// pair gets a function of its own, instantiated from this template. MPI's
// contract is inout[i] = in[i] op inout[i]; every op here is commutative.
template <size_t D, size_t O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
  static const ReduceKernel kernel = reduce_kernel(kUserDtypes[D], static_cast<ReduceOp>(O));
  kernel(inout, inout, in, static_cast<size_t>(*len));
}

template <size_t D, size_t... O>
constexpr std::array<MPI_User_function*, kOps> user_functions_of(std::index_sequence<O...>) {
  return {&user_reduce<D, O>...};
}

constexpr std::array<std::array<MPI_User_function*, kOps>, kUserDtypes.size()> kUserFunctions = {
    user_functions_of<0>(std::make_index_sequence<kOps>()),
    user_functions_of<1>(std::make_index_sequence<kOps>()),
    user_functions_of<2>(std::make_index_sequence<kOps>()),
};

MPI_Op predefined_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProduct:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kBand:
      return MPI_BAND;
    case ReduceOp::kBor:
      return MPI_BOR;
    case ReduceOp::kBxor:
      return MPI_BXOR;
  }
  return MPI_OP_NULL;
}

} // namespace

MPI_Datatype datatype_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kHalf:
    case at::kBFloat16:
      return MPI_UINT16_T; // moved as 16-bit words, reduced by user functions
    case at::kChar:
      return MPI_INT8_T;
    case at::kByte:
    case at::kBool: // one byte holding 0 or 1
      return MPI_UINT8_T;
    case at::kShort:
      return MPI_INT16_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    default:
      DDP_INTERNAL_ASSERT(false, "no MPI datatype for dtype ", dtype);
  }
  return MPI_DATATYPE_NULL;
}

Reduction reduction_of(at::ScalarType dtype, ReduceOp op) {
  const auto op_index = static_cast<size_t>(op);
  size_t dtype_index = kUserDtypes.size();
  for (size_t d = 0; d < kUserDtypes.size(); ++d) {
    if (kUserDtypes[d] == dtype) {
      dtype_index = d;
    }
  }
  if (dtype_index == kUserDtypes.size()) {
    return {datatype_of(dtype), predefined_op(op)};
  }
  DDP_INTERNAL_ASSERT(reduce_kernel(dtype, op) != nullptr, "no kernel for ", to_string(op), " on ", dtype);
  // Created once per process and never freed: MPI_Finalize releases them.
  static std::mutex mutex;
  static std::array<std::array<MPI_Op, kOps>, kUserDtypes.size()> ops = [] {
    std::array<std::array<MPI_Op, kOps>, kUserDtypes.size()> table;
    for (auto& row : table) {
      row.fill(MPI_OP_NULL);
    }
    return table;
  }();
  std::lock_guard<std::mutex> lock(mutex);
  MPI_Op& user_op = ops[dtype_index][op_index];
  if (user_op == MPI_OP_NULL) {
    const int rc = MPI_Op_create(kUserFunctions[dtype_index][op_index], /*commute=*/1, &user_op);
    DDP_INTERNAL_ASSERT(rc == MPI_SUCCESS, "MPI_Op_create failed with code ", rc);
  }
  return {datatype_of(dtype), user_op};
}

} // namespace ddp::internal::mpi
