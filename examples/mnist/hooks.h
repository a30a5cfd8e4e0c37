#pragma once

// mnist_train's --comm-hook: how DDP reduces the gradients, and what the
// stateful hooks (PowerSGD, local SGD) report at the end.

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include <ddp/ddp.h>

#include "flags.h"

namespace mnist {

class CommHooks {
 public:
  /// Registers the hook that `flags.comm_hook` names on `model` (before any
  /// checkpoint is loaded, so that a resumed run gets the hook's state too).
  CommHooks(const Flags& flags, ddp::DistributedDataParallel& model);

  /// The optimizer to train with: `sgd` itself, or under local SGD a
  /// ddp::optim::PostLocalSGDOptimizer that steps it and then averages
  /// (its checkpoints carry the averager's step).
  std::unique_ptr<torch::optim::Optimizer> wrap_optimizer(std::unique_ptr<torch::optim::Optimizer> sgd);
  /// At the end of an epoch, before evaluating and saving: local SGD
  /// averages the parameters over every rank, so that the evaluated and
  /// saved model is one model (between averagings each rank has its own).
  void end_of_epoch(const std::vector<torch::Tensor>& parameters);
  /// Rank 0's closing line: the bytes the hook sent against the default's.
  void report(const torch::nn::Module& module) const;

 private:
  const Flags& flags_;
  std::shared_ptr<ddp::comm_hooks::PowerSGDState> powersgd_;
  std::shared_ptr<ddp::comm_hooks::PostLocalSGDState> local_sgd_;
  std::shared_ptr<ddp::model_averaging::PeriodicModelAverager> averager_;
  int world_size_ = 1;
  int64_t epoch_averagings_ = 0; // end_of_epoch's, besides the averager's
};

} // namespace mnist
