#include <ddp/comm/process_group_composite.h>

#include <c10/util/StringUtil.h>

#include "internal/check.h"

namespace ddp {

namespace {

const std::shared_ptr<ProcessGroup>& any_backend(
    const std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>>& backends) {
  DDP_CHECK(!backends.empty(), "CompositeProcessGroup: no backend given (expected at least a CPU backend)");
  DDP_CHECK(backends.begin()->second != nullptr, "CompositeProcessGroup: the backend for ",
            backends.begin()->first, " is null");
  return backends.begin()->second;
}

std::vector<at::Tensor> with(std::vector<at::Tensor> tensors, const at::Tensor& more) {
  tensors.push_back(more);
  return tensors;
}

} // namespace

CompositeProcessGroup::CompositeProcessGroup(
    std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends)
    : ProcessGroup(any_backend(backends)->rank(), any_backend(backends)->size(),
                   any_backend(backends)->timeout()),
      backends_(std::move(backends)) {
  for (const auto& [type, group] : backends_) {
    DDP_CHECK(group != nullptr, "CompositeProcessGroup: the backend for ", type, " is null");
    DDP_CHECK(group->rank() == rank() && group->size() == size(),
              "CompositeProcessGroup: the ", type, " backend is rank ", group->rank(), " of ",
              group->size(), ", expected rank ", rank(), " of ", size(), " as the other backends");
  }
  DDP_CHECK(backends_.count(c10::DeviceType::CPU) == 1,
            "CompositeProcessGroup: no backend for cpu (got ", backend_name(),
            "); barrier() and CPU tensors need one");
}

CompositeProcessGroup::~CompositeProcessGroup() = default;

std::string CompositeProcessGroup::backend_name() const {
  std::string name;
  for (const auto& [type, group] : backends_) {
    name += c10::str(name.empty() ? "" : ",", c10::DeviceTypeName(type, /*lower_case=*/true), ":",
                     group->backend_name());
  }
  return name;
}

std::shared_ptr<ProcessGroup> CompositeProcessGroup::backend_for(c10::DeviceType device_type) const {
  const auto it = backends_.find(device_type);
  DDP_CHECK(it != backends_.end(), rank_prefix(), " this group (", backend_name(),
            ") has no backend for device type ", c10::DeviceTypeName(device_type, true));
  return it->second;
}

ProcessGroup& CompositeProcessGroup::route(const char* op, const std::vector<at::Tensor>& tensors) const {
  const at::Tensor* first = nullptr;
  for (const auto& t : tensors) {
    if (!t.defined()) {
      continue;
    }
    if (first == nullptr) {
      first = &t;
    } else {
      DDP_CHECK(t.device().type() == first->device().type(), rank_prefix(), " ", op,
                ": tensors on ", first->device(), " and ", t.device(),
                " in one operation; a group of ", backend_name(),
                " sends each operation to one backend, so keep its tensors on one device type");
    }
  }
  // No defined tensor: let the CPU backend report the bad argument.
  const auto type = first == nullptr ? c10::DeviceType::CPU : first->device().type();
  const auto it = backends_.find(type);
  DDP_CHECK(it != backends_.end(), rank_prefix(), " ", op, ": tensor is on ", first->device(),
            ", but this group (", backend_name(), ") has no backend for ",
            c10::DeviceTypeName(type, true), " tensors");
  return *it->second;
}

std::shared_ptr<Work> CompositeProcessGroup::allreduce(const at::Tensor& tensor,
                                                       const AllreduceOptions& options) {
  return route("allreduce", {tensor}).allreduce(tensor, options);
}

std::shared_ptr<Work> CompositeProcessGroup::allreduce_coalesced(
    const std::vector<at::Tensor>& tensors, const AllreduceOptions& options) {
  return route("allreduce_coalesced", tensors).allreduce_coalesced(tensors, options);
}

std::shared_ptr<Work> CompositeProcessGroup::reduce_gradients(const at::Tensor& buffer,
                                                              std::vector<ReduceTarget> gradients, double scale,
                                                              std::chrono::milliseconds timeout) {
  return route("reduce_gradients", {buffer}).reduce_gradients(buffer, std::move(gradients), scale, timeout);
}

std::shared_ptr<Work> CompositeProcessGroup::broadcast(const at::Tensor& tensor,
                                                       const BroadcastOptions& options) {
  return route("broadcast", {tensor}).broadcast(tensor, options);
}

std::shared_ptr<Work> CompositeProcessGroup::reduce(const at::Tensor& tensor, const ReduceOptions& options) {
  return route("reduce", {tensor}).reduce(tensor, options);
}

std::shared_ptr<Work> CompositeProcessGroup::allgather(const std::vector<at::Tensor>& outputs,
                                                       const at::Tensor& input,
                                                       const AllgatherOptions& options) {
  return route("allgather", with(outputs, input)).allgather(outputs, input, options);
}

std::shared_ptr<Work> CompositeProcessGroup::allgather_into_tensor(const at::Tensor& output,
                                                                   const at::Tensor& input,
                                                                   const AllgatherOptions& options) {
  return route("allgather_into_tensor", {output, input}).allgather_into_tensor(output, input, options);
}

std::shared_ptr<Work> CompositeProcessGroup::gather(const std::vector<at::Tensor>& outputs,
                                                    const at::Tensor& input, const GatherOptions& options) {
  return route("gather", with(outputs, input)).gather(outputs, input, options);
}

std::shared_ptr<Work> CompositeProcessGroup::scatter(const at::Tensor& output,
                                                     const std::vector<at::Tensor>& inputs,
                                                     const ScatterOptions& options) {
  return route("scatter", with(inputs, output)).scatter(output, inputs, options);
}

std::shared_ptr<Work> CompositeProcessGroup::reduce_scatter(const at::Tensor& output,
                                                            const std::vector<at::Tensor>& inputs,
                                                            const ReduceScatterOptions& options) {
  return route("reduce_scatter", with(inputs, output)).reduce_scatter(output, inputs, options);
}

std::shared_ptr<Work> CompositeProcessGroup::alltoall(const at::Tensor& output, const at::Tensor& input,
                                                      const AlltoallOptions& options) {
  return route("alltoall", {output, input}).alltoall(output, input, options);
}

std::shared_ptr<Work> CompositeProcessGroup::barrier(const BarrierOptions& options) {
  return backends_.at(c10::DeviceType::CPU)->barrier(options);
}

bool CompositeProcessGroup::supports_sparse_allreduce(c10::DeviceType device_type) const {
  const auto it = backends_.find(device_type);
  return it != backends_.end() && it->second->supports_sparse_allreduce(device_type);
}

void CompositeProcessGroup::wait_for_pending_work() {
  for (const auto& [type, group] : backends_) {
    group->wait_for_pending_work();
  }
}

std::shared_ptr<Work> CompositeProcessGroup::send(const at::Tensor& tensor, int dst_rank,
                                                  const PointToPointOptions& options) {
  return route("send", {tensor}).send(tensor, dst_rank, options);
}

std::shared_ptr<Work> CompositeProcessGroup::recv(const at::Tensor& tensor, int src_rank,
                                                  const PointToPointOptions& options) {
  return route("recv", {tensor}).recv(tensor, src_rank, options);
}

} // namespace ddp
