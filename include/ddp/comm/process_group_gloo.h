#pragma once

/// The Gloo backend: collectives over TCP between CPU processes.

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>

#include <ddp/comm/process_group.h>
#include <ddp/store/store.h>

namespace ddp {

/// Options of `ProcessGroupGloo::create`.
/// Example:
/// `ddp::ProcessGroupGloo::create(store, rank, size, ddp::ProcessGroupGlooOptions().interface("eth0"))`
struct ProcessGroupGlooOptions {
  /// Deadline of rendezvous and default deadline of every operation.
  /// Default: kDefaultTimeout (30 minutes).
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  /// Network interface to bind (e.g. "eth0"). Default: "" (DDP_SOCKET_IFNAME
  /// or GLOO_SOCKET_IFNAME if set, else the address given by `hostname`, else
  /// the interface that reaches `master_addr`, else this host's name).
  TORCH_ARG(std::string, interface) = "";
  /// Address or host name to bind. Default: "" (see `interface`).
  TORCH_ARG(std::string, hostname) = "";
  /// Rank 0's host; only used to find the interface that reaches it.
  /// Default: "".
  TORCH_ARG(std::string, master_addr) = "";
  /// Name of the group; prefixes its keys in the store. Default: "default".
  TORCH_ARG(std::string, group_name) = "default";
  /// `allocate_collective_buffer` gives CPU buffers of at least this many
  /// bytes in memory that the ranks of one host all map (from /dev/shm),
  /// when every rank shares this host, or when the ranks span hosts with
  /// the same number (two or more) on each. An allreduce of more than
  /// 64 KiB whose tensor is the same range of such a buffer on every rank
  /// then goes through that memory instead of TCP: each rank reduces its
  /// share of all the ranks' buffers and writes the result into each, in
  /// the order of Gloo's ring, so the result has the TCP path's bits (on
  /// several hosts: within each host, then between hosts over TCP); an
  /// allgather_into_tensor whose input is such a range (one host) copies
  /// each peer's input from where it lies. DDP allocates its gradient
  /// buckets this way, FullyShardedDataParallel its shards. When /dev/shm
  /// is too small the buffers are private, with one warning. A negative
  /// value, or DDP_GLOO_SHM=0 in the environment, turns it off; a rank
  /// that has it off, or a larger value, turns it off for that buffer on
  /// every rank. Default: 65536.
  TORCH_ARG(int64_t, shared_memory_min_bytes) = 65536;
};

/// What a Gloo group has done in shared memory (see
/// `ProcessGroupGlooOptions::shared_memory_min_bytes`).
struct GlooSharedMemoryStats {
  int64_t buffers = 0;    ///< buffers in shared memory that this rank maps now
  int64_t bytes = 0;      ///< bytes of all that were allocated, this rank's own
  int64_t allreduces = 0; ///< allreduces that went through shared memory
  int64_t allgathers = 0; ///< allgather_into_tensor calls that did
  int64_t direct = 0;     ///< of the allreduces, reduce_gradients calls that read the peers' gradients where they lie
  int64_t reduce_scatters = 0; ///< reduce_scatter calls that went through shared memory
};

/// A ProcessGroup over Gloo.
///
/// Collectives run asynchronously, in issue order, on the group's worker
/// threads, using Gloo's own algorithms (ring allreduce and friends) with
/// the group's deadline; large buffers from `allocate_collective_buffer`
/// are reduced in shared memory when the ranks share a host. CUDA tensors are staged through pinned
/// host memory. `send`/`recv` start at once and complete in `Work::wait`.
///
/// Thread-safety: as ProcessGroup. The destructor finishes queued work (each
/// bounded by its deadline), then closes all connections.
class ProcessGroupGloo : public ProcessGroup {
  struct PrivateTag {};

 public:
  /// Meets the other `size - 1` ranks through `store` and connects to each.
  /// Throws `TimeoutError` naming the ranks that never arrived when
  /// rendezvous does not complete within `options.timeout()`.
  static std::shared_ptr<ProcessGroupGloo> create(
      std::shared_ptr<Store> store,
      int rank,
      int size,
      const ProcessGroupGlooOptions& options = {});

  /// Use `create`.
  ProcessGroupGloo(PrivateTag, std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupGlooOptions& options);
  ~ProcessGroupGloo() override;

  std::string backend_name() const override {
    return "gloo";
  }
  void wait_for_pending_work() override;

  std::shared_ptr<Work> allreduce(const at::Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> allreduce_coalesced(
      const std::vector<at::Tensor>& tensors, const AllreduceOptions& options = {}) override;
  /// See ProcessGroup: on one host, the peers' gradients are read where
  /// they lie; otherwise they go through the buffer.
  std::shared_ptr<Work> reduce_gradients(const at::Tensor& buffer, std::vector<ReduceTarget> gradients,
                                         double scale,
                                         std::chrono::milliseconds timeout = kUseGroupTimeout) override;
  bool reduces_gradients_in_place() const override;
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, const BroadcastOptions& options = {}) override;
  std::shared_ptr<Work> reduce(const at::Tensor& tensor, const ReduceOptions& options = {}) override;
  std::shared_ptr<Work> allgather(
      const std::vector<at::Tensor>& outputs, const at::Tensor& input,
      const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> allgather_into_tensor(
      const at::Tensor& output, const at::Tensor& input, const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> gather(
      const std::vector<at::Tensor>& outputs, const at::Tensor& input,
      const GatherOptions& options = {}) override;
  std::shared_ptr<Work> scatter(
      const at::Tensor& output, const std::vector<at::Tensor>& inputs,
      const ScatterOptions& options = {}) override;
  std::shared_ptr<Work> reduce_scatter(
      const at::Tensor& output, const std::vector<at::Tensor>& inputs,
      const ReduceScatterOptions& options = {}) override;
  using ProcessGroup::alltoall; // and the list form
  std::shared_ptr<Work> alltoall(
      const at::Tensor& output, const at::Tensor& input, const AlltoallOptions& options = {}) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& options = {}) override;
  /// See ProcessGroup; buffers in shared memory as
  /// `ProcessGroupGlooOptions::shared_memory_min_bytes` says.
  at::Tensor allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) override;
  /// Whether `tensor` lies in a buffer of this group that the ranks of this
  /// host map (see `allocate_collective_buffer`).
  bool is_shared_buffer(const at::Tensor& tensor) const override;
  /// See ProcessGroup: when every rank is on this host and the buffer is
  /// large enough to be shared.
  at::Tensor allocate_common_buffer(int64_t numel, const at::TensorOptions& options) override;
  /// True: an allreduce of shared buffers runs in shared memory.
  bool reduces_in_shared_memory() const override {
    return true;
  }
  /// This rank's counts so far.
  GlooSharedMemoryStats shared_memory_stats() const;
  std::shared_ptr<Work> send(
      const at::Tensor& tensor, int dst_rank, const PointToPointOptions& options = {}) override;
  std::shared_ptr<Work> recv(
      const at::Tensor& tensor, int src_rank, const PointToPointOptions& options = {}) override;

 private:
  // allreduce_coalesced of dense tensors; with `gradients` (one tensor),
  // reduce_gradients.
  std::shared_ptr<Work> allreduce_dense(const std::vector<at::Tensor>& tensors, const AllreduceOptions& options,
                                        std::shared_ptr<const std::vector<ReduceTarget>> gradients,
                                        double scale);

  class Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace ddp
