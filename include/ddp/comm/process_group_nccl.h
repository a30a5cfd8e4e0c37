#pragma once

/// The NCCL backend: collectives between CUDA devices, one GPU per process.
///
/// This header needs no CUDA header, but the class exists only in a ddp built
/// with the NCCL backend (`DDP_WITH_NCCL` is then defined for users of
/// `ddp::ddp`; see docs/gpu.md).

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/store/store.h>

namespace ddp {

/// Options of `ProcessGroupNCCL::create`.
/// Example:
/// `ddp::ProcessGroupNCCL::create(store, rank, size, ddp::ProcessGroupNCCLOptions().device_index(local_rank))`
struct ProcessGroupNCCLOptions {
  /// Deadline of communicator creation and default deadline of every
  /// operation. Default: kDefaultTimeout (30 minutes).
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  /// Name of the group; prefixes its keys in the store. Default: "default".
  TORCH_ARG(std::string, group_name) = "default";
  /// The CUDA device this process drives. Default: -1, meaning the device of
  /// the tensors of the first operation; an operation with no tensor before
  /// that (a barrier) picks LOCAL_RANK modulo the device count, or the rank
  /// modulo the device count when LOCAL_RANK is unset.
  TORCH_ARG(int, device_index) = -1;
  /// Run collectives on a high-priority CUDA stream. Default: false.
  TORCH_ARG(bool, high_priority_stream) = false;
  /// How often the watchdog checks for deadlines and asynchronous NCCL
  /// errors while nothing completes. Default: 100 ms.
  TORCH_ARG(std::chrono::milliseconds, watchdog_interval) = std::chrono::milliseconds(100);
};

/// A ProcessGroup over NCCL.
///
/// How it works. The group drives one CUDA device, the device of its first
/// operation's tensors (or `device_index`). Its NCCL communicator is created
/// on first use: rank 0 makes a unique id and shares it through the store,
/// and every rank waits for the others with the group's deadline. All
/// operations run, in issue order, on one CUDA stream of the communicator,
/// which first waits (with a CUDA event, not the CPU) for the work already
/// queued on the caller's current stream. A call returns as soon as the
/// operation is queued on the GPU (the first call also creates the
/// communicator, which waits for every rank).
///
/// `Work::wait()` with the default `kUseGroupTimeout` does not block the CPU:
/// it makes the caller's current stream wait for the operation, and from then
/// on the Work counts as completed for the caller, its results usable by
/// anything queued on that stream (the meaning of completion for CUDA
/// futures in PyTorch). `wait(timeout)` with an explicit timeout blocks the
/// CPU until the GPU has finished the operation, or throws `TimeoutError`.
/// A barrier's Work always blocks the CPU in `wait()`.
///
/// No silent hangs: a watchdog thread checks every running operation against
/// its deadline and asks NCCL for asynchronous errors. On either it aborts
/// the communicator (which also ends the stuck GPU kernels), fails that
/// operation with `TimeoutError` or `CommError` naming it ("[rank 1/4]
/// allreduce #12"), fails every other pending operation, and every later
/// one: the group is then unusable and must be destroyed.
///
/// Differences from Gloo: tensors must be CUDA tensors on the group's device;
/// bitwise reductions (BAND, BOR, BXOR) are not supported; `send`/`recv`
/// between two ranks match in issue order (the tag is not used for matching)
/// and share the collectives' stream, so every rank must issue them in an
/// order that lets both ends meet.
///
/// Thread-safety: as ProcessGroup. Operations may be issued from any thread;
/// Work callbacks (`then`) run on the thread that completes the Work: the
/// caller of `wait()`, or the watchdog thread with the issuing stream
/// current. The destructor lets pending operations finish (each bounded by
/// its deadline), then releases the communicator.
class ProcessGroupNCCL : public ProcessGroup {
  struct PrivateTag {};

 public:
  /// Creates the group; the NCCL communicator itself is created on first
  /// use. Throws `c10::Error` when no CUDA device is present or the options
  /// are invalid.
  static std::shared_ptr<ProcessGroupNCCL> create(
      std::shared_ptr<Store> store,
      int rank,
      int size,
      const ProcessGroupNCCLOptions& options = {});

  /// True when at least one CUDA device is present.
  static bool is_available();

  /// The version of the NCCL library loaded at run time, e.g. "2.28.9".
  static std::string nccl_version();

  /// Use `create`.
  ProcessGroupNCCL(PrivateTag, std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupNCCLOptions& options);
  ~ProcessGroupNCCL() override;

  std::string backend_name() const override {
    return "nccl";
  }
  /// True: NCCL moves device memory only.
  bool needs_device_buffers() const override {
    return true;
  }
  void wait_for_pending_work() override;

  /// The CUDA device the group drives, or -1 until its first operation
  /// chooses it.
  int device_index() const;

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
  /// One group launch for the whole batch; one Work, repeated per op.
  std::vector<std::shared_ptr<Work>> batch_point_to_point(
      const std::vector<PointToPointOp>& ops,
      std::chrono::milliseconds timeout = kUseGroupTimeout) override;

  using ProcessGroup::alltoall; // and the list form
  std::shared_ptr<Work> alltoall(
      const at::Tensor& output, const at::Tensor& input, const AlltoallOptions& options = {}) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& options = {}) override;
  std::shared_ptr<Work> send(
      const at::Tensor& tensor, int dst_rank, const PointToPointOptions& options = {}) override;
  std::shared_ptr<Work> recv(
      const at::Tensor& tensor, int src_rank, const PointToPointOptions& options = {}) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace ddp
