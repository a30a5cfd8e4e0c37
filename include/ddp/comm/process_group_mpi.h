#pragma once

/// The MPI backend: collectives through the MPI library that started the job
/// (`mpirun`, `srun`).
///
/// This header needs no MPI header, but the class exists only in a ddp built
/// with the MPI backend (`DDP_WITH_MPI` is then defined for users of
/// `ddp::ddp`; see docs/design.md, "ProcessGroupMPI").

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp {

/// Options of `ProcessGroupMPI::create`.
/// Example:
/// `ddp::ProcessGroupMPI::create(ddp::ProcessGroupMPIOptions().timeout(std::chrono::minutes(5)))`
struct ProcessGroupMPIOptions {
  /// Default deadline of every operation. Default: kDefaultTimeout (30 minutes).
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  /// How often the watchdog looks at the running collective when it has no
  /// deadline to wake up for. Bounds how late a deadline can fire after a
  /// collective starts. Default: 100 ms.
  TORCH_ARG(std::chrono::milliseconds, watchdog_interval) = std::chrono::milliseconds(100);
  /// Collectives of at least this many bytes first wait, without using the
  /// CPU, until every rank has issued them (a non-blocking barrier polled
  /// with growing sleeps), and only then enter MPI's blocking collective,
  /// which polls the network on a busy CPU. This keeps a rank that is early
  /// from stealing the CPU that a late rank needs to catch up (DDP's
  /// gradient buckets while backward still computes). 0 turns it on for
  /// every size; a negative value turns it off. Default: 65536.
  TORCH_ARG(int64_t, arrival_wait_min_bytes) = 65536;
  /// Allreduces of at least this many bytes run ddp's ring algorithm over
  /// MPI point-to-point messages instead of MPI_Allreduce, which Open MPI
  /// 4.1 runs more slowly on large buffers (docs/benchmarks.md). A negative
  /// value always uses MPI_Allreduce. Default: 8 MiB.
  TORCH_ARG(int64_t, ring_allreduce_min_bytes) = int64_t{8} << 20;
  /// `allocate_collective_buffer` gives CPU buffers of at least this many
  /// bytes in memory that every rank maps, when every rank of the group is
  /// on one node; an allreduce of such a buffer (the same range on every
  /// rank) reads the peers' memory directly, with no messages: each rank
  /// reduces its share of the buffer once and writes the result into every
  /// rank's buffer; an allgather_into_tensor whose input is such a range
  /// copies each peer's input from where it lies. DDP allocates its
  /// gradient buckets this way, FullyShardedDataParallel its shards and
  /// reduction buffers. A negative
  /// value turns it off. The memory comes from /dev/shm; when that is full
  /// the buffers are private, with a warning. Must be the same on every
  /// rank. Default: 65536.
  TORCH_ARG(int64_t, shared_memory_min_bytes) = 65536;
  /// The ranks of MPI_COMM_WORLD that form the group, sorted ascending, this
  /// process's among them: group rank r is world rank ranks[r] (a
  /// communicator made with MPI_Comm_create_group, which only these ranks
  /// call). Empty: every rank of the world. `ddp::new_group` sets it.
  /// Default: empty.
  TORCH_ARG(std::vector<int>, ranks) = {};
};

/// A ProcessGroup over MPI: one `MPI_Comm_dup` of `MPI_COMM_WORLD` per group.
///
/// How it works. The first group of the process initialises MPI
/// (`MPI_Init_thread` with `MPI_THREAD_MULTIPLE`, unless the program did it
/// already), and MPI is finalised at exit. Rank and size are MPI's: the job
/// must be started by an MPI launcher (`mpirun -np 4 ./app`, `srun`), or be
/// a world of one. Each collective checks its arguments on the caller's
/// thread (the checks every backend shares), takes the next sequence number
/// and queues a task; the group's worker thread runs the tasks one at a time
/// in issue order, each with one blocking MPI collective (or, for large
/// allreduces, ddp's ring over MPI point-to-point). Reductions of Half,
/// BFloat16 and bool use ddp's own kernels as user-defined MPI_Ops.
/// CUDA tensors are staged through pinned host memory. `send`/`recv` post
/// `MPI_Isend`/`MPI_Irecv` at once and complete in `Work::wait`.
///
/// Deadlines. MPI cannot cancel a collective. A watchdog thread fails a
/// collective that runs past its deadline with `TimeoutError`
/// ("[rank 0/2] allreduce #7 timed out after 1000 ms ..."), and every queued
/// and later one with a `CommError`: the group is unusable. The collective
/// itself stays blocked inside MPI, so when the group is destroyed, or the
/// process exits, while it is still blocked, ddp calls `MPI_Abort`, which
/// ends every rank of the job (docs/errors.md). `Work::wait()` with the
/// default timeout waits a little past the deadline (`watchdog_interval`
/// plus one second) so that it reports the watchdog's verdict; with an
/// explicit timeout it only stops waiting, as for every backend.
///
/// Differences from Gloo: no store and no network set-up of ours (MPI has
/// them); groups are created in the same order on every rank (each is an
/// `MPI_Comm_dup`, a collective); several groups run their collectives
/// concurrently, each on its own communicator.
///
/// Thread-safety: as ProcessGroup. Work callbacks (`then`) run on the worker
/// thread, or on the watchdog thread for a collective that timed out. The
/// destructor finishes queued work (each bounded by its deadline), then
/// frees the communicator; if a collective is still blocked in MPI past its
/// deadline, it calls `MPI_Abort` instead of hanging.
class ProcessGroupMPI : public ProcessGroup {
  struct PrivateTag {};

 public:
  /// Creates a group of every rank of the MPI job, or of `options.ranks()`
  /// (initialising MPI when this is the first). A collective of the group's
  /// ranks: each must create its groups in the same order. Throws
  /// `c10::Error` when `ranks` is not sorted, repeats a rank, names one
  /// outside the world or leaves this process out. Throws `c10::Error` when the launcher started several
  /// processes that MPI does not see as one job (ddprun, torchrun), or when
  /// the MPI library lacks `MPI_THREAD_MULTIPLE`.
  static std::shared_ptr<ProcessGroupMPI> create(const ProcessGroupMPIOptions& options = {});

  /// The MPI library's own version string (`MPI_Get_library_version`), e.g.
  /// "Open MPI v4.1.4, ...". Does not initialise MPI.
  static std::string mpi_version();

  /// Use `create`.
  ProcessGroupMPI(PrivateTag, int rank, int size, const ProcessGroupMPIOptions& options);
  ~ProcessGroupMPI() override;

  std::string backend_name() const override {
    return "mpi";
  }

  std::shared_ptr<Work> allreduce(const at::Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> allreduce_coalesced(
      const std::vector<at::Tensor>& tensors, const AllreduceOptions& options = {}) override;
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
  /// `ProcessGroupMPIOptions::shared_memory_min_bytes` says.
  at::Tensor allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) override;
  /// Whether `tensor` lies in a buffer of this group that every rank maps
  /// (see `allocate_collective_buffer`).
  bool is_shared_buffer(const at::Tensor& tensor) const override;
  /// See ProcessGroup: when every rank is on this host and the buffer is
  /// large enough to be shared.
  at::Tensor allocate_common_buffer(int64_t numel, const at::TensorOptions& options) override;
  /// True: an allreduce of shared buffers runs in shared memory.
  bool reduces_in_shared_memory() const override {
    return true;
  }
  /// Returns once every collective issued so far has completed or failed,
  /// or once one has timed out (it stays blocked inside MPI; see the class
  /// comment). Not send/recv: they complete in their own `wait`.
  void wait_for_pending_work() override;
  std::shared_ptr<Work> send(
      const at::Tensor& tensor, int dst_rank, const PointToPointOptions& options = {}) override;
  std::shared_ptr<Work> recv(
      const at::Tensor& tensor, int src_rank, const PointToPointOptions& options = {}) override;

 private:
  // allocate_collective_buffer's and allocate_common_buffer's collective:
  // undefined where the memory cannot be shared.
  at::Tensor allocate_shared(int64_t numel, const at::TensorOptions& options, bool common);

  class Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace ddp
