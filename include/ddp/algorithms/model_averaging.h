#pragma once

/// Model averaging, PyTorch's `torch.distributed.algorithms.model_averaging`:
/// average the ranks' parameters every few steps instead of their gradients
/// every step (with local SGD: each rank, or each node, steps on its own
/// gradients in between). See docs/collectives.md, "Model averaging".

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp::model_averaging {

/// Replaces every tensor of `params` by its average over `group` (nullptr:
/// the default group): one allreduce of the flattened parameters, divided
/// by the group's size first, as PyTorch's `utils.average_parameters`. A
/// process outside `group` returns at once.
void average_parameters(const std::vector<at::Tensor>& params,
                        const std::shared_ptr<ProcessGroup>& group = nullptr);

/// The averagers' base, PyTorch's `ModelAverager`: what PostLocalSGDOptimizer
/// and a training loop call, whichever the averager. `step()` counts the
/// calls of `average_parameters`.
///
/// Thread-safety: not thread-safe; use an averager from one thread (an
/// averaging call is a collective, which every rank makes in the same order).
class ModelAverager {
 public:
  virtual ~ModelAverager();

  /// Averages `params` (a collective) when this call's number says so, and
  /// counts the call.
  virtual void average_parameters(const std::vector<at::Tensor>& params) = 0;

  /// Calls so far.
  int64_t step() const {
    return step_;
  }
  /// Sets the call count, as assigning PyTorch's `averager.step` does: to
  /// resume a run from a checkpoint, set it to the optimizer steps taken.
  /// Throws `c10::Error` when negative.
  void set_step(int64_t step);

 protected:
  ModelAverager() = default;

  int64_t step_ = 0;
};

/// Averages every `period` calls after `warmup_steps` calls (the first
/// averaging at call warmup_steps, then warmup_steps + period, ...); call
/// `average_parameters` after each optimizer step. As PyTorch's, the
/// averagers average only the parameters that have a gradient. PyTorch's
/// `PeriodicModelAverager`: its checks (period >= 1, warmup_steps >= 0) and
/// its warning for period 1.
class PeriodicModelAverager : public ModelAverager {
 public:
  explicit PeriodicModelAverager(int64_t period, int64_t warmup_steps = 0,
                                 std::shared_ptr<ProcessGroup> group = nullptr);

  void average_parameters(const std::vector<at::Tensor>& params) override;

 private:
  int64_t period_;
  int64_t warmup_steps_;
  std::shared_ptr<ProcessGroup> group_;
};

/// Averages within groups of increasing size at increasing periods,
/// PyTorch's `HierarchicalModelAverager`: `period_group_sizes` is a list of
/// (period, group size), periods ascending; at a call numbered `step` (from
/// 0) at or after warmup, the last listed period that divides `step` picks
/// the group (the consecutive ranks of that size that include this rank,
/// made with `new_subgroups` of the default group; the last size must be
/// the whole group's), and no period dividing it means no averaging. Its
/// checks: a non-empty list, periods >= 1, sizes dividing the group's, the
/// last size the group's, warmup_steps >= 0; a warning when the largest
/// period is 1. Making it is a collective of the default group (the
/// subgroups).
class HierarchicalModelAverager : public ModelAverager {
 public:
  explicit HierarchicalModelAverager(std::vector<std::pair<int64_t, int>> period_group_sizes,
                                     int64_t warmup_steps = 0,
                                     std::shared_ptr<ProcessGroup> group = nullptr);

  void average_parameters(const std::vector<at::Tensor>& params) override;

 private:
  std::vector<std::pair<int64_t, std::shared_ptr<ProcessGroup>>> levels_; // period, this rank's group
  int64_t warmup_steps_;
};

} // namespace ddp::model_averaging
