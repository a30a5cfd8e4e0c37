#pragma once

// LibTorch dtypes and ReduceOps in MPI's terms (private header).
//
// Moving data needs only an MPI datatype of the element's size. Reducing it
// needs a (datatype, MPI_Op) pair: MPI's predefined operations where MPI has
// them (SUM, PROD, MIN, MAX, BAND, BOR, BXOR on float, double and the
// fixed-width integers), so that MPI's tuned algorithms and vectorised
// kernels run; for Half, BFloat16 and bool, which MPI cannot reduce, a
// user-defined MPI_Op that calls ddp's own kernel (comm/reduce_kernels.h),
// with SUM as OR and PRODUCT as AND on bool as torch.distributed does.
// AVG is SUM here: the caller divides afterwards.

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <ddp/comm/types.h>

namespace ddp::internal::mpi {

// The datatype that moves elements of `dtype` (one of is_supported_dtype's).
MPI_Datatype datatype_of(at::ScalarType dtype);

// What MPI reduces `dtype` with `op`.
struct Reduction {
  MPI_Datatype datatype;
  MPI_Op op;
};

// The reduction for a pair that reduce_kernel(dtype, op) accepts (the caller
// has checked it). User-defined operations are created on first use, once
// per process; MPI must be initialised. Thread-safe.
Reduction reduction_of(at::ScalarType dtype, ReduceOp op);

} // namespace ddp::internal::mpi
