#include <ddp/algorithms/model_averaging.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <ddp/group.h>
#include <ddp/init.h>

#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::model_averaging {

namespace {

std::shared_ptr<ProcessGroup> or_default(const std::shared_ptr<ProcessGroup>& group, const char* who) {
  auto chosen = group ? group : default_process_group();
  DDP_CHECK(chosen, who, ": no process group; call ddp::init_process_group() first or pass a group");
  return chosen;
}

std::string prefix(const std::shared_ptr<ProcessGroup>& group, const char* who) {
  return c10::str("[rank ", group->rank(), "/", group->size(), "] ", who);
}

// PyTorch's get_params_to_average: the averagers skip parameters without
// a gradient (frozen, or unused so far).
std::vector<at::Tensor> with_gradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> kept;
  for (const auto& p : params) {
    if (p.grad().defined()) {
      kept.push_back(p);
    }
  }
  return kept;
}

} // namespace

void average_parameters(const std::vector<at::Tensor>& params, const std::shared_ptr<ProcessGroup>& group) {
  const auto chosen = or_default(group, "average_parameters");
  if (!is_member(chosen) || params.empty()) {
    return;
  }
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const auto& p : params) {
    flat.push_back(p.detach().reshape({-1}));
  }
  auto all = at::cat(flat);
  all.div_(chosen->size());
  chosen->allreduce(all)->wait();
  int64_t offset = 0;
  for (const auto& p : params) {
    p.detach().copy_(all.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

PeriodicModelAverager::PeriodicModelAverager(int64_t period, int64_t warmup_steps,
                                             std::shared_ptr<ProcessGroup> group)
    : period_(period), warmup_steps_(warmup_steps), group_(or_default(group, "PeriodicModelAverager")) {
  const std::string who = prefix(group_, "PeriodicModelAverager");
  DDP_CHECK(warmup_steps >= 0, who, ": warmup_steps must be a non-negative number (got ", warmup_steps, ")");
  DDP_CHECK(period >= 1, who, ": period must be a positive value (got ", period, ")");
  if (period == 1) {
    internal::log_warning(who + ": with period 1 there is no need to average models: all-reducing the parameters "
                      "every step costs no less than DistributedDataParallel's all-reduce of the gradients; "
                      "use DistributedDataParallel alone");
  }
}

void PeriodicModelAverager::average_parameters(const std::vector<at::Tensor>& params) {
  if (step_ >= warmup_steps_ && (step_ - warmup_steps_) % period_ == 0) {
    model_averaging::average_parameters(with_gradients(params), group_);
  }
  ++step_;
}

HierarchicalModelAverager::HierarchicalModelAverager(std::vector<std::pair<int64_t, int>> period_group_sizes,
                                                     int64_t warmup_steps, std::shared_ptr<ProcessGroup> group)
    : warmup_steps_(warmup_steps) {
  const auto whole = or_default(group, "HierarchicalModelAverager");
  const std::string who = prefix(whole, "HierarchicalModelAverager");
  DDP_CHECK(!period_group_sizes.empty(), who, ": period_group_sizes must not be empty");
  DDP_CHECK(warmup_steps >= 0, who, ": warmup_steps must be a non-negative number (got ", warmup_steps, ")");
  const int world = whole->size();
  DDP_CHECK(period_group_sizes.back().second == world, who, ": the last group size must be the group's size (",
            world, "), got ", period_group_sizes.back().second);
  for (size_t i = 0; i < period_group_sizes.size(); ++i) {
    const auto [period, size] = period_group_sizes[i];
    DDP_CHECK(period >= 1, who, ": period ", period, " (entry ", i, ") must be a positive value");
    DDP_CHECK(size >= 1 && world % size == 0, who, ": group size ", size, " (entry ", i,
              ") must be positive and divide the group's size ", world);
  }
  if (period_group_sizes.back().first == 1) {
    internal::log_warning(who + ": with a largest period of 1 there is no need to average models: all-reducing the "
                      "parameters every step costs no less than DistributedDataParallel's all-reduce of the "
                      "gradients; use DistributedDataParallel alone");
  }
  for (const auto& [period, size] : period_group_sizes) {
    if (size == world) {
      levels_.emplace_back(period, whole);
    } else {
      DDP_CHECK(whole == default_process_group(), who, ": the subgroups of size ", size,
                " are made from the default group; pass no group, or only the group's own size");
      levels_.emplace_back(period, new_subgroups(size).mine);
    }
  }
}

void HierarchicalModelAverager::average_parameters(const std::vector<at::Tensor>& params) {
  if (step_ >= warmup_steps_) {
    // As PyTorch: the step itself (not the steps since warmup) picks the
    // level, the last listed period that divides it.
    for (auto it = levels_.rbegin(); it != levels_.rend(); ++it) {
      if (step_ % it->first == 0) {
        model_averaging::average_parameters(with_gradients(params), it->second);
        break;
      }
    }
  }
  ++step_;
}

ModelAverager::~ModelAverager() = default;

void ModelAverager::set_step(int64_t step) {
  DDP_CHECK(step >= 0, "ModelAverager::set_step: the step must not be negative (got ", step, ")");
  step_ = step;
}

} // namespace ddp::model_averaging
