#pragma once

/// `ProcessGroup`: the ranks of a job and the collectives they run together.

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/TensorOptions.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/types.h>
#include <ddp/comm/work.h>

namespace ddp {

/// A fixed set of `size()` processes, each with a `rank()` in [0, size), that
/// run collectives together.
///
/// Contract (as torch.distributed's): every rank issues the same collectives
/// in the same order, with tensors of the same dtype and element count (and
/// the same root). Each collective gets the next number of a per-group
/// sequence counter that only goes up; that number tags its messages and
/// names it in errors ("[rank 1/4] allreduce #12 timed out after 30000 ms").
/// Every backend checks the contract: ranks whose calls differ (op, dtype,
/// element count, reduce op, root) all get a `CollectiveMismatchError`
/// naming both calls. Gloo and MPI check before any data moves, so the group
/// stays usable; NCCL checks inside the collective's own launch and, since
/// the mismatched calls may have moved data, aborts the group
/// (docs/design.md, "Collective fingerprints").
/// Point-to-point `send`/`recv` are outside that order: they are matched by
/// (peer, tag).
///
/// Every collective is asynchronous: it checks its arguments on the caller's
/// thread (throwing `c10::Error` on misuse), queues the operation and returns
/// a `Work`. Tensors are reduced and written in place, so pass the tensor
/// itself, not a copy. Any strides are taken (a column view, a transposed or
/// channels-last tensor: copied to contiguous memory and back for the
/// transport); an output must not be expanded (its elements would share
/// memory). Complex tensors are taken everywhere, as torch.distributed takes
/// them: they travel as pairs of reals, so SUM and AVG reduce the real and
/// imaginary parts apart and the other reduce ops refuse a complex tensor
/// (docs/design.md, "The ProcessGroup contract").
///
/// Every operation has a deadline: the group's `timeout()` unless the call's
/// options give another. Past it the operation fails with `TimeoutError`.
/// After any `CommError` the group is unusable and must be destroyed.
///
/// Thread-safety: the methods may be called from several threads, but the
/// order in which collectives are issued must be the same on every rank, so a
/// program that issues them from several threads must order those threads
/// itself.
/// One send or receive of `ProcessGroup::batch_point_to_point`; `peer` is a
/// rank of the group. (`ddp::P2POp`, <ddp/comm/batch_p2p.h>, is the
/// PyTorch-shaped form, with global ranks.)
struct PointToPointOp {
  bool is_send = true;
  at::Tensor tensor;
  int peer = 0;
  int tag = 0;
};

/// A tensor that stands for a range of a buffer in
/// `ProcessGroup::reduce_gradients`: the `target.numel()` elements from
/// element `offset` on.
struct ReduceTarget {
  int64_t offset = 0;
  at::Tensor target;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, std::chrono::milliseconds timeout);
  virtual ~ProcessGroup();

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank in [0, size()); -1 in the handle that
  /// `ddp::new_group` gives a process outside the group.
  int rank() const {
    return rank_;
  }
  /// The number of ranks.
  int size() const {
    return size_;
  }
  /// The default deadline of every operation.
  std::chrono::milliseconds timeout() const {
    return timeout_;
  }
  /// The backend: "gloo", "mpi" or "nccl"; for a `CompositeProcessGroup`
  /// (Backend::kAuto with a GPU), PyTorch's form "cpu:gloo,cuda:nccl"; for
  /// the handle that `ddp::new_group` gives a process outside the group,
  /// "non-member".
  virtual std::string backend_name() const = 0;

  /// Reduces `tensor` across ranks in place; every rank gets the result.
  /// Where `supports_sparse_allreduce` says so, `tensor` may be a sparse COO
  /// tensor (SUM only): it then becomes the coalesced sum of every rank's.
  virtual std::shared_ptr<Work> allreduce(
      const at::Tensor& tensor,
      const AllreduceOptions& options = {}) = 0;

  /// Reduces each tensor of `tensors` in place as one operation. The tensors
  /// may differ in shape but must share dtype and device.
  virtual std::shared_ptr<Work> allreduce_coalesced(
      const std::vector<at::Tensor>& tensors,
      const AllreduceOptions& options = {}) = 0;

  /// DistributedDataParallel's built-in allreduce of one bucket. `buffer`:
  /// a contiguous 1-D CPU tensor; `gradients`: ranges of it, each with the
  /// contiguous CPU tensor of the buffer's dtype that stands for it, apart
  /// from the buffer's memory and from each other, the ranges not
  /// overlapping. Each rank's input is its buffer, except over its
  /// gradients' ranges, where it is the gradient times `scale` (rounded as
  /// `at::mul` by a scalar rounds it). The sum over the ranks goes into the
  /// gradients, and into the buffer outside their ranges; inside them the
  /// buffer's contents are unspecified. The Work's result is `{buffer}`. A
  /// collective as `allreduce(buffer)` is, and interchangeable with it: a
  /// rank may call that where the others call this (the gradients may
  /// differ by rank). The default multiplies the gradients into the buffer,
  /// runs `allreduce`, and copies the result back on the thread that
  /// completes it; Gloo on one host reads the peers' gradients where they
  /// lie (see `reduces_gradients_in_place`).
  virtual std::shared_ptr<Work> reduce_gradients(const at::Tensor& buffer, std::vector<ReduceTarget> gradients,
                                                 double scale,
                                                 std::chrono::milliseconds timeout = kUseGroupTimeout);
  /// Whether `reduce_gradients` reads the gradients where they lie rather
  /// than from the buffer, so that a caller need not copy them into it:
  /// Gloo when its ranks share one host and may read each other's memory
  /// (`DDP_CROSS_MEMORY`), known once the group has allocated a shared
  /// buffer. False by default.
  virtual bool reduces_gradients_in_place() const {
    return false;
  }


  /// Copies the root's `tensor` into `tensor` on every other rank.
  virtual std::shared_ptr<Work> broadcast(
      const at::Tensor& tensor,
      const BroadcastOptions& options = {}) = 0;

  /// Reduces `tensor` across ranks into the root's `tensor`; other ranks'
  /// tensors are left unspecified (they may hold partial results).
  virtual std::shared_ptr<Work> reduce(
      const at::Tensor& tensor,
      const ReduceOptions& options = {}) = 0;

  /// Gathers every rank's `input` into `outputs[r]` on every rank. `outputs`
  /// holds size() tensors shaped like `input`.
  virtual std::shared_ptr<Work> allgather(
      const std::vector<at::Tensor>& outputs,
      const at::Tensor& input,
      const AllgatherOptions& options = {}) = 0;

  /// Gathers every rank's `input` into one tensor `output` of size() times
  /// its elements, rank r's at offset r * input.numel().
  virtual std::shared_ptr<Work> allgather_into_tensor(
      const at::Tensor& output,
      const at::Tensor& input,
      const AllgatherOptions& options = {}) = 0;

  /// Gathers every rank's `input` into `outputs[r]` on the root. `outputs`
  /// holds size() tensors on the root and must be empty elsewhere.
  virtual std::shared_ptr<Work> gather(
      const std::vector<at::Tensor>& outputs,
      const at::Tensor& input,
      const GatherOptions& options = {}) = 0;

  /// Copies the root's `inputs[r]` into `output` on rank r. `inputs` holds
  /// size() tensors on the root and must be empty elsewhere.
  virtual std::shared_ptr<Work> scatter(
      const at::Tensor& output,
      const std::vector<at::Tensor>& inputs,
      const ScatterOptions& options = {}) = 0;

  /// Reduces `inputs[r]` across ranks into `output` on rank r. `inputs` holds
  /// size() tensors of `output`'s dtype; `inputs[r]` has the same element
  /// count on every rank, and rank r's `output` has that count. The chunks
  /// may differ in size from rank to rank, as in PyTorch.
  virtual std::shared_ptr<Work> reduce_scatter(
      const at::Tensor& output,
      const std::vector<at::Tensor>& inputs,
      const ReduceScatterOptions& options = {}) = 0;

  /// PyTorch's `reduce_scatter_tensor`: `input` holds size() equal chunks
  /// one after the other (`input.numel()` is size() x `output.numel()`, of
  /// any shape: [size() * n, ...] or [size(), ...]), and `output` becomes
  /// chunk r's reduction on rank r. `reduce_scatter` of the chunks, as
  /// views when `input` is contiguous.
  std::shared_ptr<Work> reduce_scatter_tensor(
      const at::Tensor& output,
      const at::Tensor& input,
      const ReduceScatterOptions& options = {});

  /// Splits `input` along its first dimension into size() equal chunks, sends
  /// chunk r to rank r, and writes the chunk from rank r into chunk r of
  /// `output` (PyTorch's `all_to_all_single`). With
  /// `options.input_split_sizes`/`output_split_sizes` the chunks are those
  /// row counts instead, and `output` may have another first size than
  /// `input` (same sizes past it); every rank checks, before any data
  /// moves, that what each rank sends a peer is what that peer expects, and
  /// all fail with one message naming the first pair that does not.
  virtual std::shared_ptr<Work> alltoall(
      const at::Tensor& output,
      const at::Tensor& input,
      const AlltoallOptions& options = {}) = 0;

  /// Sends `inputs[r]` to rank r and receives rank r's tensor for this rank
  /// into `outputs[r]` (PyTorch's `all_to_all`): size() tensors in each
  /// list, of one dtype and device, of any sizes; `outputs[r]` has as many
  /// elements as rank r's `inputs[this rank]`. One uneven `alltoall` of the
  /// packed tensors (options: the deadline; its split sizes must be empty).
  std::shared_ptr<Work> alltoall(
      const std::vector<at::Tensor>& outputs,
      const std::vector<at::Tensor>& inputs,
      const AlltoallOptions& options = {});

  /// Completes once every rank has called it.
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& options = {}) = 0;

  /// A barrier that names the ranks that did not reach it, as PyTorch's
  /// `monitored_barrier`: every other rank sends a token to rank 0 and waits
  /// for rank 0's acknowledgement; rank 0 receives from each rank within
  /// `timeout` (from the start of the call). When a rank is late, rank 0
  /// throws `TimeoutError` naming it ("rank 2 did not reach
  /// monitored_barrier within 5000 ms"), or naming every late rank with
  /// `wait_all_ranks`; the other ranks then time out waiting for rank 0.
  /// Blocking. Uses `send`/`recv` with CPU tensors and the reserved tag
  /// kMonitoredBarrierTag, so it needs a backend with CPU point-to-point:
  /// Gloo, MPI, or the cpu:gloo,cuda:nccl composite (not NCCL alone).
  void monitored_barrier(std::chrono::milliseconds timeout = kUseGroupTimeout,
                         bool wait_all_ranks = false);

  /// The tag that monitored_barrier uses for its sends and receives.
  static constexpr int kMonitoredBarrierTag = (1 << 30) + 17;

  /// Whether `allreduce` takes a sparse COO tensor on `device_type` (the
  /// Gloo and MPI backends: CPU and CUDA). DistributedDataParallel asks at
  /// construction, for a model with sparse gradients. Default: what the
  /// backend declared with `set_supports_sparse_allreduce` (false unless it
  /// did).
  virtual bool supports_sparse_allreduce(c10::DeviceType device_type) const;

  /// A zero-filled, contiguous 1-D tensor of `numel` elements for
  /// collectives that run again and again on the same memory, as
  /// DistributedDataParallel's gradient buckets do. A collective: every rank
  /// calls it at the same point, with the same `numel` and `options`; it
  /// blocks until the memory is ready (within the group's timeout). The
  /// default is `at::zeros`. The Gloo and MPI backends, when the ranks share
  /// a host, put large CPU buffers in memory that all of them map, and
  /// reduce them in place without sending messages
  /// (`ProcessGroupGlooOptions::shared_memory_min_bytes`,
  /// `ProcessGroupMPIOptions::shared_memory_min_bytes`).
  virtual at::Tensor allocate_collective_buffer(int64_t numel, const at::TensorOptions& options);
  /// Whether `tensor` lies in memory from `allocate_collective_buffer` that
  /// the ranks of this host map (false by default).
  virtual bool is_shared_buffer(const at::Tensor& tensor) const {
    return false;
  }
  /// A collective, called as `allocate_collective_buffer` is, for memory
  /// that the ranks use together: one zero-filled 1-D CPU tensor of
  /// `numel` elements whose bytes are the same memory on every rank (the
  /// Gloo and MPI backends, every rank on one host, large enough as for
  /// `allocate_collective_buffer`), or an undefined tensor on every rank
  /// where the backend cannot give one (the default). What one rank writes
  /// there every rank reads: the caller orders writes and reads with
  /// barriers, and passes no such tensor to a collective.
  /// FullyShardedDataParallel gathers each unit's parameters in one: a
  /// rank's shard is its part of it, and the all-gather is a barrier.
  virtual at::Tensor allocate_common_buffer(int64_t numel, const at::TensorOptions& options) {
    return {};
  }

  /// Whether collectives on buffers that `is_shared_buffer` run in that
  /// shared memory, reading each byte once and writing it once per rank
  /// (the Gloo and MPI backends): FullyShardedDataParallel then
  /// reduce-scatters its CPU gradients in shared buffers, and gathers its
  /// units in common ones (`allocate_common_buffer`). False by default.
  virtual bool reduces_in_shared_memory() const {
    return false;
  }

  /// Whether the collectives move device memory only (NCCL), so that a
  /// helper that makes its own buffers for them (the object collectives)
  /// puts them on the current GPU rather than the CPU. False by default.
  virtual bool needs_device_buffers() const {
    return false;
  }

  /// Blocks until every operation issued on this group so far has completed
  /// or failed (each is bounded by its own deadline); their errors stay with
  /// their Works. `destroy_process_group()` calls it before it lets the group
  /// go, so that an operation issued without `wait()` is not dropped. The
  /// asynchronous backends override it; the default returns at once.
  virtual void wait_for_pending_work();

  /// Sends `tensor` to rank `dst_rank`; matched by a `recv` with the same tag.
  virtual std::shared_ptr<Work> send(
      const at::Tensor& tensor,
      int dst_rank,
      const PointToPointOptions& options = {}) = 0;

  /// Receives into `tensor` from rank `src_rank`.
  virtual std::shared_ptr<Work> recv(
      const at::Tensor& tensor,
      int src_rank,
      const PointToPointOptions& options = {}) = 0;

  /// Posts every send and receive of `ops` before any completes, and returns
  /// one Work per op, in order (the same Work for all of them on NCCL, which
  /// runs the batch as one group launch, as PyTorch's coalesced
  /// batch_isend_irecv). Pairs posted in any order on the two sides do not
  /// deadlock. Every op's peer and tag are checked before any is posted
  /// (PyTorch posts until one fails); `timeout` is each op's deadline.
  virtual std::vector<std::shared_ptr<Work>> batch_point_to_point(
      const std::vector<PointToPointOp>& ops,
      std::chrono::milliseconds timeout = kUseGroupTimeout);

 protected:
  /// "[rank R/W]", the prefix of every message about this group.
  std::string rank_prefix() const;
  /// The deadline to use: `requested` unless it is kUseGroupTimeout.
  std::chrono::milliseconds resolve_timeout(std::chrono::milliseconds requested) const;
  /// For the handle that `ddp::new_group` gives a process outside the group
  /// (see include/ddp/group.h): rank() is -1, as PyTorch's `get_rank(group)`
  /// for a non-member, and size() is the group's size.
  struct NonMemberTag {};
  ProcessGroup(NonMemberTag, int size, std::chrono::milliseconds timeout);
  /// For a backend's constructor: `allreduce` takes sparse COO tensors on
  /// every device type it takes dense ones.
  void set_supports_sparse_allreduce(bool value) {
    sparse_allreduce_ = value;
  }

 private:
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  bool sparse_allreduce_ = false; // written by the constructors only
};

} // namespace ddp
