#pragma once

/// PyTorch's `PostLocalSGDOptimizer` (torch.distributed.optim): an
/// optimizer that steps the one it wraps, then lets a model averager average
/// the parameters, so that post-local SGD (<ddp/comm_hooks/post_local_sgd_hook.h>)
/// needs no call of its own in the training loop, and a checkpoint carries
/// the averager's step count. See docs/collectives.md, "Local SGD".
///
/// Example, as PyTorch's documentation shows it:
/// ```
/// auto state = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, nullptr, 100);
/// model->register_comm_hook(ddp::comm_hooks::post_localSGD(state));
/// ddp::optim::PostLocalSGDOptimizer optimizer(
///     std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.01)),
///     std::make_shared<ddp::model_averaging::PeriodicModelAverager>(/*period=*/4, /*warmup_steps=*/100));
/// ... optimizer.zero_grad(); loss.backward(); optimizer.step(); ...
/// ddp::save_checkpoint(model, optimizer, "ckpt.pt");   // the averager's step too
/// ```

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <memory>

#include <ddp/algorithms/model_averaging.h>

namespace ddp::optim {

/// Thread-safety: not thread-safe; use it from one thread, like the
/// optimizer it wraps (a step that averages is a collective, which every
/// rank calls in the same order).
class PostLocalSGDOptimizer : public torch::optim::Optimizer {
 public:
  /// Wraps `optimizer` (its parameter groups become this optimizer's) and
  /// `averager` (a PeriodicModelAverager, a HierarchicalModelAverager, or
  /// any other ModelAverager). Throws `c10::Error` for a null argument.
  PostLocalSGDOptimizer(std::unique_ptr<torch::optim::Optimizer> optimizer,
                        std::shared_ptr<model_averaging::ModelAverager> averager);
  ~PostLocalSGDOptimizer() override;

  /// The wrapped optimizer's step (with this optimizer's group options,
  /// which a learning-rate scheduler may have changed), then the averager's
  /// `average_parameters` over every parameter of the groups. A collective
  /// when the averager averages.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// The wrapped optimizer's state, and the averager's step under
  /// "post_local_sgd_step" (PyTorch's state_dict()["step"]). A plain
  /// optimizer of the wrapped type reads the file, ignoring the step.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads what `save` wrote; from a file without the step (a plain
  /// optimizer's), the averager restarts at step 0 with a warning, as
  /// PyTorch's load_state_dict does.
  void load(torch::serialize::InputArchive& archive) override;

  torch::optim::Optimizer& wrapped() {
    return *optimizer_;
  }
  /// The averager's step (calls of average_parameters so far).
  int64_t averager_step() const;

 private:
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<model_averaging::ModelAverager> averager_;
};

} // namespace ddp::optim
