#include <ddp/comm/process_group.h>

#include <ATen/ATen.h>

#include <numeric>

#include "comm/reduce_targets.h"
#include "internal/check.h"

namespace ddp {

ProcessGroup::ProcessGroup(int rank, int size, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout) {
  DDP_CHECK(size >= 1, "ProcessGroup: world size must be at least 1 (got ", size, ")");
  DDP_CHECK(rank >= 0 && rank < size, "ProcessGroup: rank ", rank,
            " is out of range for world size ", size, " (expected 0 <= rank < world size)");
  DDP_CHECK(timeout.count() > 0, "ProcessGroup: timeout must be positive (got ",
            timeout.count(), " ms)");
}

ProcessGroup::ProcessGroup(NonMemberTag, int size, std::chrono::milliseconds timeout)
    : rank_(-1), size_(size), timeout_(timeout) {
  DDP_CHECK(size >= 1, "ProcessGroup: group size must be at least 1 (got ", size, ")");
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::wait_for_pending_work() {}

at::Tensor ProcessGroup::allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) {
  DDP_CHECK(numel >= 0, rank_prefix(), " allocate_collective_buffer: numel must not be negative (got ",
            numel, ")");
  return at::zeros({numel}, options);
}

std::shared_ptr<Work> ProcessGroup::reduce_gradients(const at::Tensor& buffer, std::vector<ReduceTarget> gradients,
                                                     double scale, std::chrono::milliseconds timeout) {
  auto checked =
      internal::checked_reduce_targets(buffer, std::move(gradients), rank_prefix() + " reduce_gradients");
  internal::scale_into(buffer, checked, scale);
  AllreduceOptions options;
  options.timeout = timeout;
  return allreduce(buffer, options)->then([buffer, checked](const std::vector<at::Tensor>&) {
    internal::copy_to_targets(buffer, checked);
    return std::vector<at::Tensor>{buffer};
  });
}

std::shared_ptr<Work> ProcessGroup::alltoall(const std::vector<at::Tensor>& outputs,
                                             const std::vector<at::Tensor>& inputs,
                                             const AlltoallOptions& options) {
  const std::string who = rank_prefix() + " alltoall (lists)";
  DDP_CHECK(options.input_split_sizes.empty() && options.output_split_sizes.empty(), who,
            ": the list form takes its splits from the tensors' sizes; expected empty split sizes in options");
  DDP_CHECK(inputs.size() == static_cast<size_t>(size()) && outputs.size() == static_cast<size_t>(size()), who,
            ": got ", inputs.size(), " inputs and ", outputs.size(), " outputs, expected ", size(),
            " of each (one per rank)");
  const at::Tensor& first = inputs[0];
  AlltoallOptions packed;
  packed.timeout = options.timeout;
  std::vector<at::Tensor> flat_inputs;
  for (size_t r = 0; r < inputs.size(); ++r) {
    for (const auto* list : {&inputs, &outputs}) {
      const at::Tensor& t = (*list)[r];
      const char* name = list == &inputs ? "inputs" : "outputs";
      DDP_CHECK(t.defined() && t.layout() == at::kStrided, who, ": ", name, "[", r,
                "] is undefined or not dense; expected a dense tensor");
      DDP_CHECK(t.scalar_type() == first.scalar_type() && t.device() == first.device(), who, ": ", name, "[",
                r, "] is ", t.scalar_type(), " on ", t.device(), ", expected ", first.scalar_type(), " on ",
                first.device(), " like inputs[0]");
    }
    flat_inputs.push_back(inputs[r].reshape({-1}));
    packed.input_split_sizes.push_back(inputs[r].numel());
    packed.output_split_sizes.push_back(outputs[r].numel());
  }
  const at::Tensor input = at::cat(flat_inputs);
  const int64_t total = std::accumulate(packed.output_split_sizes.begin(), packed.output_split_sizes.end(),
                                        int64_t{0});
  const at::Tensor output = at::empty({total}, first.options());
  auto work = alltoall(output, input, packed);
  return work->then([outputs, output](const std::vector<at::Tensor>&) {
    int64_t at = 0;
    for (const auto& t : outputs) {
      t.copy_(output.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
    return outputs;
  });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                                          const ReduceScatterOptions& options) {
  const std::string who = rank_prefix() + " reduce_scatter_tensor";
  DDP_CHECK(output.defined() && input.defined(), who, ": ", output.defined() ? "input" : "output",
            " is an undefined tensor");
  DDP_CHECK(output.layout() == at::kStrided && input.layout() == at::kStrided, who,
            ": output and input must be dense (strided) tensors");
  DDP_CHECK(input.numel() == output.numel() * size(), who, ": input has ", input.numel(),
            " elements, expected world size x output elements = ", size(), " x ", output.numel(), " = ",
            output.numel() * size());
  const at::Tensor flat = input.reshape({-1});
  std::vector<at::Tensor> chunks;
  for (int r = 0; r < size(); ++r) {
    chunks.push_back(flat.narrow(0, r * output.numel(), output.numel()));
  }
  return reduce_scatter(output, chunks, options);
}

std::vector<std::shared_ptr<Work>> ProcessGroup::batch_point_to_point(const std::vector<PointToPointOp>& ops,
                                                                      std::chrono::milliseconds timeout) {
  DDP_CHECK(!ops.empty(), rank_prefix(), " batch_isend_irecv: no ops given; expected at least one send or recv");
  // Every op's peer and tag first, so that a wrong one posts nothing (the
  // backend checks each op again, its tensor too, as it posts it).
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    DDP_CHECK(op.peer >= 0 && op.peer < size(), rank_prefix(), " batch_isend_irecv: ops[", i, "] (",
              op.is_send ? "send" : "recv", ") names peer ", op.peer, ", out of range for a group of ", size(),
              " ranks (expected 0 <= peer < ", size(), ")");
    DDP_CHECK(op.peer != rank(), rank_prefix(), " batch_isend_irecv: ops[", i, "] (",
              op.is_send ? "send" : "recv", ") names this rank itself (", op.peer, ") as its peer");
    DDP_CHECK(op.tag >= 0, rank_prefix(), " batch_isend_irecv: ops[", i, "] has tag ", op.tag,
              ", expected a tag >= 0");
    DDP_CHECK(op.tensor.defined(), rank_prefix(), " batch_isend_irecv: ops[", i, "] has no tensor");
  }
  std::vector<std::shared_ptr<Work>> works;
  for (const auto& op : ops) {
    PointToPointOptions options;
    options.tag = op.tag;
    options.timeout = timeout;
    works.push_back(op.is_send ? send(op.tensor, op.peer, options) : recv(op.tensor, op.peer, options));
  }
  return works;
}

bool ProcessGroup::supports_sparse_allreduce(c10::DeviceType /*device_type*/) const {
  return sparse_allreduce_;
}

std::string ProcessGroup::rank_prefix() const {
  return c10::str("[rank ", rank_, "/", size_, "]");
}

std::chrono::milliseconds ProcessGroup::resolve_timeout(std::chrono::milliseconds requested) const {
  if (requested == kUseGroupTimeout) {
    return timeout_;
  }
  DDP_CHECK(requested.count() > 0, rank_prefix(), " timeout must be positive or kUseGroupTimeout (got ",
            requested.count(), " ms)");
  return requested;
}

} // namespace ddp
