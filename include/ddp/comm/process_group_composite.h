#pragma once

/// One group over several backends, each collective routed by the device of
/// its tensors: PyTorch 2.x's `cpu:gloo,cuda:nccl` default group.

#include <c10/core/DeviceType.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp {

/// A ProcessGroup that owns one backend group per device type and hands each
/// operation to the backend of its tensors' device: CPU tensors to Gloo, CUDA
/// tensors to NCCL. `init_process_group` with `Backend::kAuto` makes one when
/// the build has NCCL and a CUDA device is present, so that a program whose
/// model is on the CPU keeps working on a GPU machine and a CUDA model gets
/// NCCL, with no change of code.
///
/// Every backend group spans the same ranks. The backends keep their own
/// sequence numbers, and only the backend a collective goes to takes part:
/// NCCL's communicator is created by its first CUDA collective, so a program
/// that never sends a CUDA tensor never touches NCCL. `barrier()` goes to the
/// CPU backend, so that ranks that share a GPU (which NCCL refuses) can
/// still meet; it does not wait for CUDA work in flight.
///
/// An operation whose tensors are on more than one device type, or on a
/// device type with no backend, throws `c10::Error` naming the devices.
///
/// Thread-safety: as ProcessGroup; the backend map is fixed at construction.
class CompositeProcessGroup : public ProcessGroup {
 public:
  /// `backends` maps each device type to its group; all must have the same
  /// rank, size and default timeout, and one must serve the CPU.
  CompositeProcessGroup(std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends);
  ~CompositeProcessGroup() override;

  /// The backends by device type, as PyTorch writes a backend string:
  /// "cpu:gloo,cuda:nccl".
  std::string backend_name() const override;

  /// The group serving `device_type`; throws when there is none.
  std::shared_ptr<ProcessGroup> backend_for(c10::DeviceType device_type) const;

  std::shared_ptr<Work> allreduce(const at::Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> allreduce_coalesced(
      const std::vector<at::Tensor>& tensors, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> reduce_gradients(const at::Tensor& buffer, std::vector<ReduceTarget> gradients,
                                         double scale,
                                         std::chrono::milliseconds timeout = kUseGroupTimeout) override;
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
  /// The answer of the backend serving `device_type` (false when none does).
  bool supports_sparse_allreduce(c10::DeviceType device_type) const override;
  /// Waits for every backend's.
  void wait_for_pending_work() override;
  std::shared_ptr<Work> send(
      const at::Tensor& tensor, int dst_rank, const PointToPointOptions& options = {}) override;
  std::shared_ptr<Work> recv(
      const at::Tensor& tensor, int src_rank, const PointToPointOptions& options = {}) override;

 private:
  // The backend of the device type shared by every defined tensor of
  // `tensors`; `op` names the operation in errors.
  ProcessGroup& route(const char* op, const std::vector<at::Tensor>& tensors) const;

  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends_;
};

} // namespace ddp
