#pragma once

// A reduce-scatter over MPI point-to-point messages (private header).
//
// Why. Open MPI 4.1's MPI_Reduce_scatter_block took 30 ms for 25 MB on two
// ranks of one machine, where MPI_Alltoall moving the same bytes took 7 ms
// (bench/fsdp_bench, docs/benchmarks.md): FullyShardedDataParallel
// reduce-scatters every unit's gradients every step.
//
// How it works (Note [Direct reduce-scatter] in the Gloo backend is the same
// algorithm). Every rank sends chunk r of its input straight to rank r and
// receives its own chunk from every other rank, all at once: the lowest
// peer's part straight into `output`, the others' into a scratch buffer
// (none with two ranks). Then output = own part + that part, + the others
// in rank order. Only this rank computes its chunk, so the order of the
// sum needs no agreement; a rank sends and receives (n - 1) / n of the
// input, as in a ring, in one step.
//
// The messages travel on the group's collective communicator, which only
// the worker thread uses (as the ring allreduce's do).

#include <mpi.h>

#include <vector>

#include "comm/reduce_kernels.h"

namespace ddp::internal::mpi {

// Reduces `input` (counts[r] elements of `element_size` bytes for each rank
// r, end to end) across the ranks of `comm` (`rank` of `size`) into
// `output` (counts[rank] elements), which must not overlap `input`. Throws
// CommError when MPI fails.
void direct_reduce_scatter(const void* input, const std::vector<int>& counts, void* output,
                           size_t element_size, MPI_Datatype datatype, const ReduceKernel& kernel,
                           MPI_Comm comm, int rank, int size);

} // namespace ddp::internal::mpi
