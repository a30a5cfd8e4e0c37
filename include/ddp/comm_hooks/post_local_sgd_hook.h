#pragma once

/// Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local
/// SGD", 2018), PyTorch's `PostLocalSGDState` / `post_localSGD_hook`: the
/// gradients are averaged over every rank for `start_localSGD_iter`
/// iterations, then only within a subgroup (by default the ranks of one
/// node), while a model averager (<ddp/algorithms/model_averaging.h>)
/// averages the parameters over every rank every few steps. See
/// docs/collectives.md, "Local SGD".
///
/// Example, as PyTorch's documentation shows it:
/// ```
/// auto state = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(
///     nullptr, nullptr, /*start_localSGD_iter=*/100);
/// model->register_comm_hook(ddp::comm_hooks::post_localSGD(state));
/// ddp::model_averaging::PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/100);
/// for (...) {
///   optimizer.zero_grad();
///   loss_fn(model->forward(x), y).backward();
///   optimizer.step();
///   averager.average_parameters(model->parameters());
/// }
/// ```

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm_hooks/comm_hooks.h>

namespace ddp::comm_hooks {

/// The state of a `post_localSGD` hook: the iteration count (kept by
/// checkpoints) and the groups.
///
/// Thread-safety: not thread-safe; the hook uses it during backward, the
/// checkpoint functions between iterations, never at once.
class PostLocalSGDState : public CommHookState {
 public:
  /// `process_group`: the group of the global averaging (nullptr: the
  /// group DistributedDataParallel hands the hook, the model's).
  /// `subgroup`: the group of the local averaging (nullptr: made at the
  /// first local iteration with `new_subgroups` of the default group, one
  /// group per node of the launcher's local world size, LOCAL_WORLD_SIZE;
  /// PyTorch makes one per node of as many ranks as the node has GPUs).
  /// `start_localSGD_iter`: iterations averaged over `process_group` first.
  /// `post_local_gradient_allreduce`: after them, average within
  /// `subgroup` (true) or not at all (false). Throws `c10::Error` for a
  /// negative `start_localSGD_iter`.
  PostLocalSGDState(std::shared_ptr<ProcessGroup> process_group, std::shared_ptr<ProcessGroup> subgroup,
                    int64_t start_localSGD_iter, bool post_local_gradient_allreduce = true);

  /// Iterations averaged globally so far (it stops at start_localSGD_iter,
  /// as PyTorch's `iter`).
  int64_t iteration() const {
    return iteration_;
  }
  int64_t start_localSGD_iter() const {
    return start_localSGD_iter_;
  }
  /// The local group: the one given, the one made, or nullptr before the
  /// first local iteration made it.
  const std::shared_ptr<ProcessGroup>& subgroup() const {
    return subgroup_;
  }

  /// CommHookState: checkpoints keep the iteration count. A state loads
  /// only what a state with the same `start_localSGD_iter` and
  /// `post_local_gradient_allreduce` saved.
  std::string kind() const override;
  std::string save_state() const override;
  void load_state(const std::vector<std::string>& saved, int rank, int world_size) override;

 private:
  friend CommHook post_localSGD(std::shared_ptr<PostLocalSGDState> state);
  std::shared_ptr<Work> run_hook(ProcessGroup& group, GradBucket& bucket);

  std::shared_ptr<ProcessGroup> process_group_;
  std::shared_ptr<ProcessGroup> subgroup_;
  const int64_t start_localSGD_iter_;
  const bool post_local_gradient_allreduce_;
  int64_t iteration_ = 0; // changed on the autograd thread, read between iterations
};

/// PyTorch's `post_localSGD_hook`: for `start_localSGD_iter` iterations
/// the average over the global group (as `allreduce()`), then the average
/// within the subgroup (or, without `post_local_gradient_allreduce`, this
/// rank's own gradients). Pair it with a model averager whose warmup is
/// `start_localSGD_iter`. The state must outlive the model's backward
/// passes; the hook holds it.
CommHook post_localSGD(std::shared_ptr<PostLocalSGDState> state);

} // namespace ddp::comm_hooks
