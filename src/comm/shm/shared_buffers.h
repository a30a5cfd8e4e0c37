#pragma once

// Buffers that the ranks of a group on one host all map, and the
// collectives that work on them without messages (private header). The
// Gloo and MPI backends both use them, each through a Coordinator of its
// own.
//
// Why. Through a transport (TCP loopback for Gloo, Open MPI's shared-memory
// messages), a byte of an allreduce is copied into the transport and out of
// it on every step of the algorithm. When the ranks' buffers themselves lie
// in memory that all of them map, rank r reads its share of every rank's
// buffer, reduces it once and writes the result into every rank's buffer:
// each byte is read once and written once per rank. DDP's gradient buckets
// and FSDP's shards are such buffers: they live as long as the model and
// take part in a collective every step (ProcessGroup::allocate_collective_buffer).
//
// How it works. See Note [Shared buffers].

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ddp/comm/process_group.h>

#include "comm/reduce_kernels.h"

namespace ddp::internal::shm {

// Note [Shared buffers]
// Hosts. The first allocation learns which rank is on which host: each rank
// contributes an identity made of its kernel's boot id, the device and inode
// of its /dev/shm, and its network namespace (ranks in separate network
// namespaces are separate hosts, as containers and the test suite's
// two-node clusters make them), and rank 0 contributes a random key for the
// objects' names. When every rank is on one host, all of them share
// buffers. When the ranks span several hosts with the same number on each
// (at least two), and the transport can reduce among any subset of ranks
// (Gloo's can), the ranks of each host share buffers among themselves:
// the multi-host form below. Otherwise no buffer is shared.
//
// Allocation (a collective of the group, on its worker thread, in issue
// order): each rank that shares creates a POSIX shared-memory object
// "/ddp-<key>-<rank>-<id>", reserves its pages (posix_fallocate: a full
// /dev/shm says so now, not with SIGBUS later) and maps it; an allreduce of
// "did it work" follows; each rank maps its host's peers' objects; a second
// allreduce; each rank unlinks its own name (and, when something failed,
// every name of the allocation, so that a peer that died in between leaves
// nothing behind). From then on the memory lives as long as some process
// maps it, and a crash, kill -9 included, leaves nothing in /dev/shm. If any
// rank failed, every rank frees what it made and returns no buffer (the
// caller uses private memory), with one warning saying why. Freeing is
// local: the tensor's deleter unmaps this rank's mappings, whatever the
// peers do.
//
// Allreduce. Only when every rank's tensor is the same range of the same
// buffer (same allocation id, same offset: checked with one allreduce of
// (v, -v) under MAX, which every rank runs whenever the group has ever
// allocated a shared buffer and the allreduce is large enough, so that all
// take the same path). That allreduce is also the first barrier: every rank
// has finished writing its buffer (for ProcessGroup::reduce_gradients it
// also carries each rank's offer to read the gradients where they lie, Note
// [Gradients read where they lie], and when that is not taken, a second
// barrier follows the gradients' copy into the buffers). Each rank then reduces its share of all
// the ranks' buffers into its own, 256 KiB at a time so that a piece is
// copied while still in cache, and copies the result into the peers'
// buffers; a closing barrier says every share is done. Each element is
// computed once and copied, so every rank ends with the same bits. Two
// orders of reduction:
// - kOwnFirst (MPI): rank r's share is the r-th of `size` equal parts,
//   reduced as its own values, then the others' in rank order.
// - kGlooRing (Gloo): the shares and the order of Gloo's ring allreduce
//   (gloo/allreduce.cc): the buffer is cut into segments exactly as the
//   ring cuts it, rank c computes chunk c, and element by element the
//   result is x_c + (x_{c+1} + (... + (x_{c-2} + x_{c-1}))), ranks mod n,
//   each "+" the kernel with the same operands in the same places as the
//   ring's. So the shared path gives the TCP path's bits, for every dtype
//   and op.
// Multi-host: rank with local index j reduces the j-th of `m` parts of its
// host's buffers (its own values, then its host's others in rank order),
// then reduces that part with the ranks of local index j on the other hosts
// through the transport (Coordinator::reduce_among, in rank order, so that
// every host gets the same bits; on three hosts or more a reduce-scatter
// and an all-gather, Note [Reduced among hosts] in
// gloo_exchange_allreduce.cpp), and copies it into its host's buffers.
//
// All-gather (allgather_into_tensor; one host only), when every rank's
// input is the same range of one shared buffer (the same check): after that
// first barrier each rank copies every rank's input, read where that rank's
// object is mapped, into its own output, then waits at a closing barrier,
// so that no rank writes its input again while a peer may still read it.
//
// Reduce-scatter (reduce_scatter; one host only), when every rank's inputs
// lie end to end in one range of one shared buffer, the same on every rank
// (the same check): after that first barrier rank r reduces the r-th part
// of every rank's range, read where each rank's object is mapped, into its
// output, its own values first, then the others' in rank order (the order
// of the TCP path's direct reduce-scatter, so the same bits), 256 KiB at a
// time; a closing barrier follows, so that no rank writes its inputs again
// while a peer may still read them. Nothing is written into a peer's
// memory: an allreduce would copy every part to every rank, which FSDP's
// gradient reduction does not need.
//
// Note [Common buffers]
// allocate(..., common = true), on one host only: the host's first rank
// creates one object and every rank maps it, so that every rank's tensor
// is the same memory (ProcessGroup::allocate_common_buffer). The steps,
// the unlinking and the failures are the per-rank objects'. No collective
// takes a common buffer's tensors through shared memory (locate() does not
// know them): what the ranks write there and when is the caller's to
// order, with barriers (FSDP's gathered parameters, Note [Gathered in
// common memory] in fsdp/flat_unit.cpp). Each rank counts 1/W of it as its
// own, in the statistics and the plan's tensor memory.
//
// Failure. Every wait is the transport's, with the collective's deadline:
// a peer that dies makes the barrier or the check fail with the transport's
// error, which names it; nothing ever waits on a flag in shared memory. A
// dead peer's memory stays mapped, and valid, for as long as this rank maps
// it.

// What shared buffers need from a group's transport: small collectives,
// called on the group's worker thread inside one collective's task. Each
// throws the transport's error on a timeout or a lost peer.
class Coordinator {
 public:
  virtual ~Coordinator() = default;
  // Element-wise maximum of `values` over every rank of the group, in place.
  virtual void max(int64_t* values, size_t count) = 0;
  // Returns once every rank has called it, without spinning.
  virtual void barrier() = 0;
  // Whether reduce_among works; the multi-host form needs it.
  virtual bool can_reduce_among() const {
    return false;
  }
  // Reduces `data` (`count` elements, `bytes` bytes) in place among
  // `members` (ascending, this rank among them), combining in their order.
  virtual void reduce_among(void* data, size_t count, size_t bytes, const std::vector<int>& members,
                            const ReduceKernel& kernel);
};

// One shared buffer as this rank maps it: its own object and its peers'.
struct SharedMapping;

// Where a tensor's bytes lie in a shared buffer; `id` -1 when they do not.
struct SharedLocation {
  int64_t id = -1;
  int64_t offset = 0; // bytes from the buffer's start
  std::shared_ptr<const SharedMapping> mapping; // kept mapped while in use
};

enum class ReduceOrder { kOwnFirst, kGlooRing };

// What a group has done in shared memory, for tests and benchmarks.
struct SharedStats {
  int64_t buffers = 0;    // buffers this rank maps now
  int64_t bytes = 0;      // bytes of every allocation that succeeded, this rank's own
  int64_t allreduces = 0; // collectives that went through shared memory
  int64_t allgathers = 0;
  int64_t direct = 0; // of the allreduces: reduce_direct's
  int64_t reduce_scatters = 0;
};

// Tests only: DDP_TEST_SHM_KILL_AT=<point>:<rank> kills this process at
// `point` when it is rank `rank`.
void test_kill_point(const char* point, int rank);

// Gloo's ring allreduce cuts a buffer of `total` bytes into chunks, one per
// rank; returns the chunk's bytes (shared_buffers.cpp says how).
size_t ring_chunk_bytes(size_t total, size_t element, int size, size_t max_segment);
// Gloo's AllreduceOptions::kMaxSegmentSize, which the ring cuts by. The
// shared path's test compares its bits with the ring's on every build, so a
// Gloo that cut differently would show.
constexpr size_t kGlooMaxSegmentBytes = 1024 * 1024;

class SharedBuffers {
 public:
  // `who` is the group's "[rank R/W]", `backend` its backend's name for
  // messages ("ProcessGroupGloo").
  SharedBuffers(std::string who, std::string backend, int rank, int size);
  ~SharedBuffers();

  SharedBuffers(const SharedBuffers&) = delete;
  SharedBuffers& operator=(const SharedBuffers&) = delete;

  // A collective: a zero-filled 1-D CPU tensor of `numel` elements in memory
  // that this host's ranks map, or an undefined tensor on every rank when
  // that cannot be had (`wanted` false on some rank, ranks on uneven hosts,
  // no room in /dev/shm). Throws the coordinator's errors. `common`: one
  // buffer for all (one host only), see Note [Common buffers].
  at::Tensor allocate(Coordinator& coordinator, int64_t numel, const at::TensorOptions& options,
                      bool wanted, bool common = false);

  // Whether some allocation has succeeded; the same on every rank (each is a
  // collective that succeeds on all or none).
  bool any_allocated() const {
    return allocated_ > 0;
  }

  SharedStats stats() const;

  // Whether the buffers are shared within each of several hosts.
  bool multi_host() const {
    return local_.size() != static_cast<size_t>(size_);
  }

  // Where `tensor` (contiguous, CPU) lies.
  SharedLocation locate(const at::Tensor& tensor) const;
  // Where the input of an allgather_into_tensor lies, or nowhere when the
  // shared path cannot take it: the output is not on the CPU, or the input
  // overlaps the output other than as this rank's own slot (it would be
  // overwritten while the peers read it).
  SharedLocation locate_gather_input(const at::Tensor& input, const at::Tensor& output) const;

  // A collective: whether every rank passed a tensor at the same location
  // (`where`, of `bytes` bytes). `direct`: what reduce_direct needs of this
  // rank (direct_offer's answer: -2 when the caller has gradients it cannot
  // offer, -1 when it has none); `*direct_agreed`, when given, says whether
  // every rank offered the same (Note [Gradients read where they lie]), and
  // `*any_gradients` whether some rank passed gradients.
  bool agree(Coordinator& coordinator, const SharedLocation& where, int64_t bytes, int64_t direct = -1,
             bool* direct_agreed = nullptr, bool* any_gradients = nullptr) const;

  // Whether reduce_direct can run (it still needs every rank's offer): the
  // group is on one host and every rank may read every other's memory.
  // Known once a buffer has been allocated; any thread.
  bool cross_memory() const {
    return cross_memory_;
  }

  // What this rank offers for reduce_direct of `flat` into `targets`
  // (ProcessGroup::reduce_gradients'), or -2 when it cannot take part.
  int64_t direct_offer(const at::Tensor& flat, const std::vector<ReduceTarget>& targets) const;

  // A collective, after `agree` said that every rank offered: every rank's
  // targets times `scale`, summed over the ranks in Gloo's ring order, into
  // every rank's targets, read in the peers' memory where it lies (Note
  // [Gradients read where they lie], cross_memory.cpp). Returns false on
  // every rank, having changed nothing, when the ranks' layouts differ.
  bool reduce_direct(Coordinator& coordinator, const at::Tensor& flat, const std::vector<ReduceTarget>& targets,
                     double scale) const;

  // A collective, after `agree` returned true on every rank: reduces `flat`
  // (at `where`) across the ranks with `kernel` in `order` (one host; the
  // multi-host form has its own), then divides by the size when `average`.
  // With `targets` (ProcessGroup::reduce_gradients', checked and ordered),
  // the result goes into them too, and this rank's share of it goes
  // straight there (Note [Reduced into targets]).
  void allreduce(Coordinator& coordinator, const at::Tensor& flat, const SharedLocation& where,
                 const ReduceKernel& kernel, bool average, ReduceOrder order,
                 const std::vector<ReduceTarget>* targets = nullptr) const;

  // A collective, after `agree` returned true on every rank for the input's
  // location `where` (one host only: callers check multi_host()): copies
  // every rank's input into `output` (contiguous, CPU, size x the input's
  // bytes), rank order.
  void allgather(Coordinator& coordinator, const at::Tensor& output, const SharedLocation& where,
                 int64_t bytes) const;

  // A collective, after `agree` returned true on every rank for the
  // location `where` of the inputs (every rank's `size` parts of `count`
  // elements each, end to end; one host only: callers check multi_host()):
  // reduces part `rank` of every rank's inputs into `output` (contiguous,
  // CPU, `count` elements; it may be this rank's own part, not another's)
  // with `kernel`, then divides by the size when `average`.
  void reduce_scatter(Coordinator& coordinator, const at::Tensor& output, const SharedLocation& where,
                      const ReduceKernel& kernel, bool average) const;
  // Where the inputs of a reduce_scatter lie, or nowhere when the shared
  // path cannot take them: they do not lie end to end in one shared
  // buffer, with equal sizes, or `output` overlaps them other than as this
  // rank's own part (a peer would read it while it is written).
  SharedLocation locate_scatter_inputs(const std::vector<at::Tensor>& inputs, const at::Tensor& output) const;

  struct Registry; // the mapped buffers; shared with the tensors' deleters

 private:
  // Learns the hosts and rank 0's key (Note [Shared buffers]).
  void learn_hosts(Coordinator& coordinator);
  // Learns the host's ranks' process ids and whether each can read the
  // others' memory (cross_memory.cpp).
  void probe_cross_memory(Coordinator& coordinator);
  // Returns this rank's share, [first, second) in elements.
  std::pair<int64_t, int64_t> reduce_one_host(const SharedLocation& where, int64_t count, size_t element,
                                              const ReduceKernel& kernel, bool average, const at::Tensor& flat,
                                              ReduceOrder order, const std::vector<ReduceTarget>* targets) const;
  void reduce_multi_host(Coordinator& coordinator, const SharedLocation& where, int64_t count,
                         size_t element, const ReduceKernel& kernel, bool average,
                         const at::Tensor& flat) const;

  const std::string who_;
  const std::string backend_;
  const int rank_;
  const int size_;
  // The worker thread's alone.
  bool hosts_known_ = false;
  bool sharing_ = false;     // whether this group shares buffers at all
  std::vector<int> local_;   // this host's ranks, ascending
  std::vector<int> column_;  // the ranks with this rank's local index, one per host, ascending
  std::atomic<bool> cross_memory_{false}; // every rank can read every other's memory (one host only)
  std::vector<int64_t> pids_; // by rank, with cross_memory_
  int64_t probe_word_ = 0;    // what the peers read here to learn that they may
  bool warned_ = false;
  uint64_t key_ = 0;
  int64_t next_id_ = 0;
  int64_t allocated_ = 0;
  std::shared_ptr<Registry> registry_;
  // Read from any thread.
  std::atomic<int64_t> allocated_bytes_{0};
  mutable std::atomic<int64_t> allreduces_{0};
  mutable std::atomic<int64_t> allgathers_{0};
  mutable std::atomic<int64_t> direct_{0};
  mutable std::atomic<int64_t> reduce_scatters_{0};
};

} // namespace ddp::internal::shm
