#pragma once

/// `FakeProcessGroup`: one process playing rank r of a world of any size,
/// to see what a program does there (shapes, memory, bytes sent) without
/// the other ranks.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp {

namespace internal {
struct FakeLink;
class FakeWire;
class FakeSharedBuffers;
} // namespace internal

/// What the collectives of one kind ("allreduce", "allgather", ...) issued
/// on a `FakeProcessGroup` would have cost this rank.
struct FakeTraffic {
  /// How many were issued.
  int64_t calls = 0;
  /// The bytes this rank would have sent, by the bandwidth-optimal
  /// algorithms (see `FakeProcessGroup`).
  int64_t bytes_sent = 0;
};

/// A group of `size` ranks of which only this process, rank `rank`, exists:
/// PyTorch's FakeProcessGroup (the "fake" backend), for planning. Every
/// operation checks its arguments as the real backends do, then completes
/// at once, sending nothing; so DistributedDataParallel, ZeRO and
/// FullyShardedDataParallel run their steps as rank `rank` of `size` in one
/// process, with this rank's shards and buffers, and the group counts what
/// each collective would have sent (`traffic()`).
///
/// Outputs are those of a world in which every rank holds this rank's
/// inputs ("mirror"): an allreduce SUM multiplies by the size, AVG, MIN,
/// MAX, BAND and BOR leave the tensor as it is, PRODUCT raises it to the
/// size, BXOR clears it for an even size; allgather and gather repeat the
/// input; reduce_scatter reduces this rank's chunk so; alltoall fills every
/// received chunk with the chunk this rank sends itself (with split sizes,
/// the chunks of another size are left as they were); broadcast, a
/// non-root's reduce and scatter, and recv leave their tensors as they
/// were. The construction-time checks that ranks agree (DDP's and FSDP's
/// model checks, the object collectives) therefore pass. The values are not
/// those of a real job: the fake tells shapes, memory and traffic, not
/// results. Tensors may be on any device, the meta device included.
///
/// Bytes sent (n: the tensor's bytes; W: the size; nothing when W is 1):
/// allreduce 2 (W - 1) / W n (ring: reduce-scatter then all-gather);
/// allgather (W - 1) n of the input; reduce_scatter and alltoall every
/// input byte but this rank's own chunk's; broadcast n on every rank but
/// the last of the chain from the root (root + W - 1); reduce n on every
/// rank but the root; gather n on every rank but the root; scatter every
/// chunk but its own on the root; send n; recv and barrier nothing.
///
/// Made by `FakeProcessGroup::create`, by `init_process_group` with
/// `Backend::kFake` or DDP_BACKEND=fake (RANK and WORLD_SIZE from the
/// environment, no MASTER_ADDR), and for each `new_group` of a fake default
/// group. With DDP_FAKE_LINK set when the group is made (e.g.
/// `gbit=1,latency_us=100,per_host=2`), an operation's Work completes not at
/// once but after the time a link so described would take (docs/scaling.md,
/// "Overlap"); its outputs are there at once all the same. With
/// DDP_FAKE_SHM=1, buffers are shared among the ranks of a host where Gloo
/// would share them (`allocate_collective_buffer`, `allocate_common_buffer`:
/// the same paths as a real Gloo job, FSDP's gathers on one host in common
/// memory; docs/scaling.md). Thread-safe.
class FakeProcessGroup : public ProcessGroup {
 public:
  /// Rank `rank` of `size`.
  static std::shared_ptr<FakeProcessGroup> create(int rank, int size,
                                                  std::chrono::milliseconds timeout = kDefaultTimeout);

  FakeProcessGroup(int rank, int size, std::chrono::milliseconds timeout);
  ~FakeProcessGroup() override;

  std::string backend_name() const override {
    return "fake";
  }

  std::shared_ptr<Work> allreduce(const at::Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> allreduce_coalesced(const std::vector<at::Tensor>& tensors,
                                            const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, const BroadcastOptions& options = {}) override;
  std::shared_ptr<Work> reduce(const at::Tensor& tensor, const ReduceOptions& options = {}) override;
  std::shared_ptr<Work> allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                  const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> allgather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                              const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                               const GatherOptions& options = {}) override;
  std::shared_ptr<Work> scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                const ScatterOptions& options = {}) override;
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                       const ReduceScatterOptions& options = {}) override;
  std::shared_ptr<Work> alltoall(const at::Tensor& output, const at::Tensor& input,
                                 const AlltoallOptions& options = {}) override;
  using ProcessGroup::alltoall;
  std::shared_ptr<Work> barrier(const BarrierOptions& options = {}) override;
  std::shared_ptr<Work> send(const at::Tensor& tensor, int dst_rank, const PointToPointOptions& options = {}) override;
  std::shared_ptr<Work> recv(const at::Tensor& tensor, int src_rank, const PointToPointOptions& options = {}) override;

  /// With DDP_FAKE_SHM=1, as Gloo on the layout of LOCAL_WORLD_SIZE ranks a
  /// host (or DDP_FAKE_LINK's per_host): a buffer "shared" by the host's
  /// ranks (this process's own memory), else a private one as by default.
  at::Tensor allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) override;
  at::Tensor allocate_common_buffer(int64_t numel, const at::TensorOptions& options) override;
  bool is_shared_buffer(const at::Tensor& tensor) const override;
  /// True with DDP_FAKE_SHM=1.
  bool reduces_in_shared_memory() const override;

  /// What each kind of operation issued so far would have cost this rank,
  /// by name ("allreduce", "allgather_into_tensor", ...).
  std::map<std::string, FakeTraffic> traffic() const;
  /// The bytes of every operation issued so far, together.
  int64_t bytes_sent() const;
  /// Starts the counts again (e.g. after construction, to count one step).
  void reset_traffic();

 private:
  // `tensor_bytes`: the operation's tensor on this rank (an allgather's or
  // alltoall's input, a reduce_scatter's or scatter's output), for the plan.
  std::shared_ptr<Work> done(const char* op, int64_t bytes_sent, int64_t tensor_bytes, std::vector<at::Tensor> result);
  // This group's world ranks (found at the first call: a subgroup is
  // registered after it is made).
  std::vector<int> members();

  mutable std::mutex mutex_;
  std::map<std::string, FakeTraffic> traffic_; // guarded by mutex_
  std::vector<int> global_ranks_;              // guarded by mutex_; found at the first operation
  // DDP_FAKE_LINK: operations complete after their simulated time, on
  // wire_'s thread (Note [A simulated link]); null when unset.
  std::unique_ptr<internal::FakeLink> link_;
  int link_world_ = 0; // the world's size, for the link's prices
  std::unique_ptr<internal::FakeWire> wire_;
  // DDP_FAKE_SHM=1: Note [Shared buffers in the fake]; null otherwise.
  std::unique_ptr<internal::FakeSharedBuffers> shared_;
};

} // namespace ddp
