#pragma once

// A ring allreduce over MPI point-to-point messages, for large tensors
// (private header).
//
// Why. Open MPI 4.1's MPI_Allreduce is fast up to a few MiB, but on large
// buffers it is slower than a plain ring (docs/benchmarks.md has the
// figures: 64 MiB took about twice the time): its algorithms allocate and
// fault in temporary buffers of the message's size on every call, and the
// recursive-doubling ones move the whole buffer in each step. The ring moves
// each byte twice, keeps its one scratch buffer from call to call, and
// reduces with ddp's own kernels (comm/reduce_kernels.h).
//
// How it works. The buffer is cut into `size` segments of about equal
// length. Reduce-scatter: in step s (0 to size-2), rank r sends segment
// (r - s) mod size to the next rank and receives segment (r - s - 1) mod size
// from the previous one into the scratch buffer, which it reduces into its
// own copy of that segment. After size - 1 steps rank r holds segment
// (r + 1) mod size reduced over every rank. Allgather: in step s, rank r
// sends segment (r + 1 - s) mod size and receives segment (r - s) mod size in
// place. Each segment's final value is computed once, by one rank, and
// copied to the others, so every rank ends with the same bits.
//
// The messages travel on the group's collective communicator, which only
// the worker thread uses, so they cannot meet a user's send/recv (those
// have a communicator of their own).

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/reduce_kernels.h"

namespace ddp::internal::mpi {

// Reduces `count` elements of `element_size` bytes at `data` in place across
// the ranks of `comm` (`rank` of `size`), as MPI_Allreduce would. `count`
// fits in an MPI count. `scratch` is the caller's, kept between calls; it
// grows to one segment. Throws CommError when MPI fails.
void ring_allreduce(void* data, int count, size_t element_size, MPI_Datatype datatype,
                    const ReduceKernel& kernel, MPI_Comm comm, int rank, int size,
                    std::vector<uint8_t>& scratch);

} // namespace ddp::internal::mpi
