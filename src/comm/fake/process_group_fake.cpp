// The fake backend: every operation's arguments checked as the real
// backends check them, its outputs those of a world in which every rank
// holds this rank's inputs, and the bytes this rank would have sent
// counted. See the class comment in include/ddp/comm/process_group_fake.h.

#include <ddp/comm/process_group_fake.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <utility>

#include "comm/alltoall_splits.h"
#include "comm/collective_checks.h"
#include "comm/complex_arguments.h"
#include "comm/contiguous_arguments.h"
#include "comm/default_group.h"
#include "comm/fake/fake_link.h"
#include "comm/fake/fake_shared_buffers.h"
#include "comm/reduce_kernels.h"
#include "internal/check.h"
#include "internal/env.h"
#include "plan/plan_recorder.h"

namespace ddp {
namespace {

void check_fake_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  internal::check_strided(t, who, what, "the fake backend takes dense tensors only");
}

// Any device (the meta device too) and dtype; dense tensors.
constexpr internal::TensorRules kFakeRules{&check_fake_tensor, nullptr, nullptr};

// The pairs of dtype and operation that Gloo and MPI reduce (complex
// dtypes as their real views: Note [Complex arguments]).
void check_fake_reducible(at::ScalarType dtype, ReduceOp op, const std::string& who) {
  if (c10::isComplexType(dtype)) {
    internal::check_complex_reduction(dtype, op, who);
    return;
  }
  DDP_CHECK(internal::reduce_kernel(dtype, op) != nullptr, who, ": ", to_string(op), " is not defined for dtype ",
            dtype,
            op == ReduceOp::kAvg ? "; AVG needs a floating-point tensor (use SUM and divide)"
                                 : "; bitwise operations need an integer or bool tensor");
}

// `t` as if `size` ranks had each held it and reduced it with `op`.
void mirror_reduce(const at::Tensor& t, ReduceOp op, int size) {
  if (size == 1) {
    return;
  }
  const bool is_bool = t.scalar_type() == at::kBool;
  switch (op) {
    case ReduceOp::kSum:
      if (!is_bool) { // a bool SUM is an OR
        t.mul_(size);
      }
      break;
    case ReduceOp::kProduct:
      if (!is_bool) { // a bool PRODUCT is an AND
        t.pow_(size);
      }
      break;
    case ReduceOp::kBxor:
      if (size % 2 == 0) {
        t.zero_();
      }
      break;
    case ReduceOp::kAvg:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kBand:
    case ReduceOp::kBor:
      break;
  }
}

int64_t total_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) {
    total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

} // namespace

std::shared_ptr<FakeProcessGroup> FakeProcessGroup::create(int rank, int size, std::chrono::milliseconds timeout) {
  return std::make_shared<FakeProcessGroup>(rank, size, timeout);
}

FakeProcessGroup::FakeProcessGroup(int rank, int size, std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size, timeout) { // which checks the rank and size
  if (auto link = internal::fake_link_from_env(rank_prefix() + " fake group:")) {
    link_ = std::make_unique<internal::FakeLink>(*link);
    // Note [A simulated link]: the world is the default group's (WORLD_SIZE
    // when the fake group comes from the environment), of which this
    // group's members are ranks.
    const auto env_world = internal::env_get(internal::kEnvWorldSize);
    link_world_ = env_world ? std::max(size, std::atoi(env_world->c_str())) : size;
    wire_ = std::make_unique<internal::FakeWire>();
  }
  shared_ = internal::FakeSharedBuffers::from_env(rank_prefix() + " fake group:", link_ ? link_->per_host : 0);
}

FakeProcessGroup::~FakeProcessGroup() = default;

std::vector<int> FakeProcessGroup::members() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (global_ranks_.empty()) {
    // A subgroup's world ranks, from new_group's registry; the default
    // group's (or one made by create) are 0 .. size - 1.
    global_ranks_ = internal::subgroup_global_ranks(this);
    if (global_ranks_.empty()) {
      global_ranks_.resize(static_cast<size_t>(size()));
      std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
    }
  }
  return global_ranks_;
}

std::shared_ptr<Work> FakeProcessGroup::done(const char* op, int64_t bytes_sent, int64_t tensor_bytes,
                                             std::vector<at::Tensor> result) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& entry = traffic_[op];
    entry.calls += 1;
    entry.bytes_sent += size() > 1 ? bytes_sent : 0;
  }
  const std::vector<int> members = this->members();
  // Note [Plan report]
  internal::plan_count_sent(op, size() > 1 ? bytes_sent : 0, tensor_bytes, this, members);
  if (wire_ == nullptr) {
    return Work::completed(std::move(result));
  }
  auto work = Work::create(rank_prefix() + " " + op, timeout());
  wire_->submit(work, std::move(result), internal::fake_call_cost(*link_, op, bytes_sent, tensor_bytes, members, link_world_));
  return work;
}

std::shared_ptr<Work> FakeProcessGroup::allreduce(const at::Tensor& tensor, const AllreduceOptions& options) {
  const std::string who = rank_prefix() + " allreduce";
  check_fake_tensor(tensor, who, "tensor");
  check_fake_reducible(tensor.scalar_type(), options.op, who);
  mirror_reduce(tensor, options.op, size());
  const int64_t w = size();
  return done("allreduce", 2 * (w - 1) * static_cast<int64_t>(tensor.nbytes()) / w, static_cast<int64_t>(tensor.nbytes()),
              {tensor});
}

std::shared_ptr<Work> FakeProcessGroup::allreduce_coalesced(const std::vector<at::Tensor>& tensors,
                                                            const AllreduceOptions& options) {
  const std::string who = rank_prefix() + " allreduce_coalesced";
  internal::check_coalesced(tensors, who, kFakeRules);
  check_fake_reducible(tensors.front().scalar_type(), options.op, who);
  for (const auto& t : tensors) {
    mirror_reduce(t, options.op, size());
  }
  const int64_t w = size();
  return done("allreduce_coalesced", 2 * (w - 1) * total_bytes(tensors) / w, total_bytes(tensors), tensors);
}

std::shared_ptr<Work> FakeProcessGroup::broadcast(const at::Tensor& tensor, const BroadcastOptions& options) {
  const std::string who = rank_prefix() + " broadcast";
  internal::check_rooted(tensor, options.root_rank, size(), who, kFakeRules);
  // A chain from the root: every rank but the last forwards the tensor.
  const bool last = rank() == (options.root_rank + size() - 1) % size();
  return done("broadcast", last ? 0 : static_cast<int64_t>(tensor.nbytes()), static_cast<int64_t>(tensor.nbytes()),
              {tensor});
}

std::shared_ptr<Work> FakeProcessGroup::reduce(const at::Tensor& tensor, const ReduceOptions& options) {
  const std::string who = rank_prefix() + " reduce";
  internal::check_rooted(tensor, options.root_rank, size(), who, kFakeRules);
  check_fake_reducible(tensor.scalar_type(), options.op, who);
  const bool root = rank() == options.root_rank;
  if (root) {
    mirror_reduce(tensor, options.op, size());
  }
  return done("reduce", root ? 0 : static_cast<int64_t>(tensor.nbytes()), static_cast<int64_t>(tensor.nbytes()),
              {tensor});
}

std::shared_ptr<Work> FakeProcessGroup::allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                                  const AllgatherOptions&) {
  internal::check_allgather(outputs, input, size(), rank_prefix() + " allgather", kFakeRules);
  for (const auto& out : outputs) {
    out.copy_(input);
  }
  return done("allgather", (size() - 1) * static_cast<int64_t>(input.nbytes()), static_cast<int64_t>(input.nbytes()),
              outputs);
}

std::shared_ptr<Work> FakeProcessGroup::allgather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                                              const AllgatherOptions&) {
  const std::string who = rank_prefix() + " allgather_into_tensor";
  internal::check_allgather_into_tensor(output, input, size(), who, kFakeRules);
  internal::ContiguousArguments args; // refuses an expanded output, as the backends do
  const at::Tensor out = args.output(output, who, "output");
  const int64_t n = input.numel();
  out.view({size(), n}).copy_(input.reshape({1, n}).expand({size(), n}));
  args.copy_back();
  return done("allgather_into_tensor", (size() - 1) * static_cast<int64_t>(input.nbytes()),
              static_cast<int64_t>(input.nbytes()), {output});
}

std::shared_ptr<Work> FakeProcessGroup::gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                               const GatherOptions& options) {
  internal::check_gather(outputs, input, rank(), options.root_rank, size(), rank_prefix() + " gather", kFakeRules);
  for (const auto& out : outputs) { // empty but on the root
    out.copy_(input);
  }
  const bool root = rank() == options.root_rank;
  return done("gather", root ? 0 : static_cast<int64_t>(input.nbytes()), static_cast<int64_t>(input.nbytes()), outputs);
}

std::shared_ptr<Work> FakeProcessGroup::scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                                const ScatterOptions& options) {
  internal::check_scatter(output, inputs, rank(), options.root_rank, size(), rank_prefix() + " scatter", kFakeRules);
  int64_t sent = 0;
  if (rank() == options.root_rank) {
    output.copy_(inputs[static_cast<size_t>(rank())]);
    sent = total_bytes(inputs) - static_cast<int64_t>(inputs[static_cast<size_t>(rank())].nbytes());
  }
  return done("scatter", sent, static_cast<int64_t>(output.nbytes()), {output});
}

std::shared_ptr<Work> FakeProcessGroup::reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                                                       const ReduceScatterOptions& options) {
  const std::string who = rank_prefix() + " reduce_scatter";
  internal::check_reduce_scatter(output, inputs, rank(), size(), who, kFakeRules);
  check_fake_reducible(output.scalar_type(), options.op, who);
  const auto& mine = inputs[static_cast<size_t>(rank())];
  output.copy_(mine.reshape(output.sizes()));
  mirror_reduce(output, options.op, size());
  return done("reduce_scatter", total_bytes(inputs) - static_cast<int64_t>(mine.nbytes()),
              static_cast<int64_t>(output.nbytes()), {output});
}

std::shared_ptr<Work> FakeProcessGroup::alltoall(const at::Tensor& output, const at::Tensor& input,
                                                 const AlltoallOptions& options) {
  const std::string who = rank_prefix() + " alltoall";
  const auto layout = internal::check_alltoall(output, input, size(), options, who, kFakeRules);
  const auto me = static_cast<size_t>(rank());
  const at::Tensor in = input.reshape({-1});
  const at::Tensor own = in.narrow(0, layout.send_offsets[me], layout.send_counts[me]);
  internal::ContiguousArguments args;
  const at::Tensor flat = args.output(output, who, "output").view({-1});
  for (size_t peer = 0; peer < layout.recv_counts.size(); ++peer) {
    // Every peer sends this rank what this rank sends itself, where the
    // sizes allow it.
    if (layout.recv_counts[peer] == layout.send_counts[me]) {
      flat.narrow(0, layout.recv_offsets[peer], layout.recv_counts[peer]).copy_(own);
    }
  }
  args.copy_back();
  const int64_t sent = std::accumulate(layout.send_counts.begin(), layout.send_counts.end(), int64_t{0}) -
                       layout.send_counts[me];
  return done("alltoall", sent * static_cast<int64_t>(input.element_size()), static_cast<int64_t>(input.nbytes()),
              {output});
}

std::shared_ptr<Work> FakeProcessGroup::barrier(const BarrierOptions&) {
  return done("barrier", 0, 0, {});
}

std::shared_ptr<Work> FakeProcessGroup::send(const at::Tensor& tensor, int dst_rank,
                                             const PointToPointOptions& options) {
  internal::check_point_to_point(tensor, dst_rank, options.tag, rank(), size(), rank_prefix() + " send", "destination",
                                 kFakeRules);
  return done("send", static_cast<int64_t>(tensor.nbytes()), static_cast<int64_t>(tensor.nbytes()), {tensor});
}

std::shared_ptr<Work> FakeProcessGroup::recv(const at::Tensor& tensor, int src_rank,
                                             const PointToPointOptions& options) {
  internal::check_point_to_point(tensor, src_rank, options.tag, rank(), size(), rank_prefix() + " recv", "source",
                                 kFakeRules);
  return done("recv", 0, static_cast<int64_t>(tensor.nbytes()), {tensor});
}

at::Tensor FakeProcessGroup::allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) {
  DDP_CHECK(numel >= 0, rank_prefix(), " allocate_collective_buffer: numel must not be negative (got ", numel, ")");
  // Note [Shared buffers in the fake]
  if (shared_ == nullptr || size() < 2 || !internal::FakeSharedBuffers::large_enough(numel, options) ||
      !shared_->shares(members())) {
    return ProcessGroup::allocate_collective_buffer(numel, options);
  }
  return shared_->allocate(numel, options, numel * static_cast<int64_t>(options.dtype().itemsize()));
}

at::Tensor FakeProcessGroup::allocate_common_buffer(int64_t numel, const at::TensorOptions& options) {
  DDP_CHECK(numel >= 0, rank_prefix(), " allocate_common_buffer: numel must not be negative (got ", numel, ")");
  const auto ranks = shared_ != nullptr && size() >= 2 ? members() : std::vector<int>{};
  if (ranks.empty() || !internal::FakeSharedBuffers::large_enough(numel, options) || !shared_->on_one_host(ranks)) {
    return {};
  }
  // As a real common buffer is counted: each of the host's ranks its part.
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  return shared_->allocate(numel, options, bytes / size());
}

bool FakeProcessGroup::is_shared_buffer(const at::Tensor& tensor) const {
  return shared_ != nullptr && shared_->contains(tensor);
}

bool FakeProcessGroup::reduces_in_shared_memory() const {
  return shared_ != nullptr;
}

std::map<std::string, FakeTraffic> FakeProcessGroup::traffic() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return traffic_;
}

int64_t FakeProcessGroup::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& entry : traffic_) {
    total += entry.second.bytes_sent;
  }
  return total;
}

void FakeProcessGroup::reset_traffic() {
  std::lock_guard<std::mutex> lock(mutex_);
  traffic_.clear();
}

} // namespace ddp
