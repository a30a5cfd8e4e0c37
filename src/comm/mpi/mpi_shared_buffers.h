#pragma once

// Buffers that every rank of an MPI group on one node maps, and the
// allreduce that works on them without messages (private header).
//
// Why. On one node Open MPI moves a message through shared memory: the
// sender copies it in, the receiver copies it out. A ring allreduce of
// 100 MB therefore reads and writes each byte several times (about 18 ms
// on the 2-core machine of docs/benchmarks.md). When the ranks' buffers
// themselves are in memory that all of them map, rank r can read segment r
// of every rank's buffer, reduce it once, and write the result into every
// rank's buffer: each byte is read once and written once per rank (about
// 5 ms for the same 100 MB). DDP's gradient buckets are such buffers: they
// live as long as the model and are allreduced every step
// (ProcessGroup::allocate_collective_buffer).
//
// How it works. See Note [MPI shared buffers].

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "comm/reduce_kernels.h"

namespace ddp::internal::mpi {

// Note [MPI shared buffers]
// Allocation (a collective of the group, on its worker thread, in issue
// order): the first one asks MPI whether every rank shares this node
// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED) and takes rank 0's random
// key for the names. Each rank then creates a POSIX shared-memory object
// "/ddp-<key>-<rank>-<id>", reserves its pages (posix_fallocate: a full
// /dev/shm says so now, not with SIGBUS later) and maps it; an allreduce of
// "did it work" follows; each rank maps every peer's object; a second
// allreduce; each rank unlinks its own name. From then on the memory lives
// as long as some process maps it, and a crash leaves nothing behind. If
// any rank failed, every rank frees what it made and returns no buffer (the
// caller uses private memory), with one warning saying why. Freeing is
// local: the tensor's deleter unmaps this rank's mappings, whatever the
// peers do; a peer's memory stays valid for as long as this rank maps it.
//
// Allreduce. Only when every rank's tensor is the same range of the same
// buffer (same allocation id, same offset: checked with one allreduce of
// (v, -v) under MPI_MAX, which every rank runs whenever the group has ever
// allocated a shared buffer and the allreduce is large enough, so that all
// take the same path): the allreduce is the first barrier (every rank has
// finished writing its buffer), rank r reduces segment r of all the ranks'
// buffers into its own (its own values first, then the others' in rank
// order) and copies the result into the peers' buffers, 256 KiB at a time
// so that each piece is copied while still in cache; a closing barrier
// (MPI_Ibarrier, waited for without spinning as in Note [MPI arrival
// wait]: the rank's autograd thread may need the core) then says every
// segment is done. Each segment is computed once and copied, so every rank
// ends with the same bits, as with the ring. Anything else (a plain tensor on some rank, several
// tensors, CUDA tensors) takes the usual path.
//
// All-gather (allgather_into_tensor), when every rank's input is the same
// range of one shared buffer (the same check): after that first barrier
// each rank copies every rank's input, read where that rank's object is
// mapped, into its own output, then waits at a closing barrier, so that no
// rank writes its input again while a peer may still read it. Each byte
// crosses memory once per reader, against twice through messages.

// One shared buffer as this rank maps it: its own object and its peers'.
struct SharedMapping;

// Where a tensor's bytes lie in a shared buffer; `id` -1 when they do not.
struct SharedLocation {
  int64_t id = -1;
  int64_t offset = 0; // bytes from the buffer's start
  std::shared_ptr<const SharedMapping> mapping; // kept mapped while in use
};

class SharedBuffers {
 public:
  // `who` is the group's "[rank R/W]".
  SharedBuffers(std::string who, int rank, int size);
  ~SharedBuffers();

  SharedBuffers(const SharedBuffers&) = delete;
  SharedBuffers& operator=(const SharedBuffers&) = delete;

  // A collective over `comm`: a zero-filled 1-D CPU tensor of `numel`
  // elements in memory every rank maps, or an undefined tensor on every
  // rank when that cannot be had (ranks on several nodes, no room in
  // /dev/shm). Throws CommError when MPI fails.
  at::Tensor allocate(MPI_Comm comm, int64_t numel, const at::TensorOptions& options);

  // Whether some allocation has succeeded; the same on every rank (each is a
  // collective that succeeds on all or none).
  bool any_allocated() const {
    return allocated_ > 0;
  }

  // Where `tensor` (contiguous, CPU) lies.
  SharedLocation locate(const at::Tensor& tensor) const;

  // A collective over `comm`: whether every rank passed a tensor at the same
  // location (`where`, of `bytes` bytes). Throws CommError when MPI fails.
  bool agree(MPI_Comm comm, const SharedLocation& where, int64_t bytes) const;

  // A collective over `comm`, after `agree` returned true on every rank:
  // reduces `flat` (at `where`) across the ranks with `kernel`, then divides
  // by the size when `average`. Throws CommError when MPI fails.
  void allreduce(MPI_Comm comm, const at::Tensor& flat, const SharedLocation& where,
                 const ReduceKernel& kernel, bool average) const;

  // A collective over `comm`, after `agree` returned true on every rank for
  // the input's location `where`: copies every rank's input into `output`
  // (contiguous, CPU, size x the input's bytes), rank order. Throws
  // CommError when MPI fails.
  void allgather(MPI_Comm comm, const at::Tensor& output, const SharedLocation& where,
                 int64_t bytes) const;

  struct Registry; // the mapped buffers; shared with the tensors' deleters

 private:
  // Waits, without spinning, until every rank has reached it.
  void closing_barrier(MPI_Comm comm, const char* what) const;
  // Asks MPI whether the ranks share a node, and takes rank 0's key.
  void learn_node(MPI_Comm comm);

  const std::string who_;
  const int rank_;
  const int size_;
  // The worker thread's alone.
  bool node_known_ = false;
  bool one_node_ = false;
  bool warned_ = false;
  uint64_t key_ = 0;
  int64_t next_id_ = 0;
  int64_t allocated_ = 0;
  std::shared_ptr<Registry> registry_;
};

} // namespace ddp::internal::mpi
