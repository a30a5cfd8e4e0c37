#include <ddp/optim/post_local_sgd_optimizer.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include <ATen/ATen.h>

#include <utility>

#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::optim {

namespace {

constexpr const char* kStepKey = "post_local_sgd_step";

std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::unique_ptr<torch::optim::Optimizer>& optimizer) {
  DDP_CHECK(optimizer != nullptr, "PostLocalSGDOptimizer: the optimizer is null");
  DDP_CHECK(dynamic_cast<ZeroRedundancyOptimizerBase*>(optimizer.get()) == nullptr,
            "PostLocalSGDOptimizer: the optimizer is a ZeroRedundancyOptimizer, whose shards local SGD's "
            "diverging replicas would not keep; wrap a plain optimizer");
  return optimizer->param_groups(); // copies: the same tensors, cloned options
}

std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const std::unique_ptr<torch::optim::Optimizer>& optimizer) {
  DDP_CHECK(optimizer != nullptr, "PostLocalSGDOptimizer: the optimizer is null");
  return optimizer->defaults().clone();
}

} // namespace

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::unique_ptr<torch::optim::Optimizer> optimizer,
                                             std::shared_ptr<model_averaging::ModelAverager> averager)
    : Optimizer(groups_of(optimizer), defaults_of(optimizer)),
      optimizer_(std::move(optimizer)),
      averager_(std::move(averager)) {
  DDP_CHECK(averager_ != nullptr, "PostLocalSGDOptimizer: the averager is null");
}

PostLocalSGDOptimizer::~PostLocalSGDOptimizer() = default;

torch::Tensor PostLocalSGDOptimizer::step(LossClosure closure) {
  // This optimizer's groups are what the caller (or a scheduler) sees and
  // changes: their options go to the wrapped optimizer's groups first.
  auto& inner = optimizer_->param_groups();
  DDP_CHECK(inner.size() == param_groups_.size(), "PostLocalSGDOptimizer::step: the wrapped optimizer has ",
            inner.size(), " parameter groups and this one ", param_groups_.size(),
            "; add groups through the PostLocalSGDOptimizer only");
  for (size_t g = 0; g < inner.size(); ++g) {
    inner[g].set_options(param_groups_[g].options().clone());
  }
  torch::Tensor loss = optimizer_->step(std::move(closure));
  std::vector<at::Tensor> params;
  for (const auto& group : param_groups_) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  averager_->average_parameters(params);
  return loss;
}

void PostLocalSGDOptimizer::save(torch::serialize::OutputArchive& archive) const {
  optimizer_->save(archive);
  archive.write(kStepKey, c10::IValue(averager_->step()));
}

void PostLocalSGDOptimizer::load(torch::serialize::InputArchive& archive) {
  c10::IValue step;
  const bool has_step = archive.try_read(kStepKey, step);
  DDP_CHECK(!has_step || step.isInt(), "PostLocalSGDOptimizer::load: '", kStepKey, "' is a ", step.tagKind(),
            ", expected an int");
  optimizer_->load(archive);
  // The loaded options are the wrapped optimizer's; this one's groups follow.
  auto& inner = optimizer_->param_groups();
  for (size_t g = 0; g < inner.size() && g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(inner[g].options().clone());
  }
  if (has_step) {
    averager_->set_step(step.toInt());
  } else {
    ddp::internal::log_warning(
        "PostLocalSGDOptimizer::load: the optimizer state holds no averager step (a plain optimizer saved it): "
        "the averager restarts at step 0");
    averager_->set_step(0);
  }
}

int64_t PostLocalSGDOptimizer::averager_step() const {
  return averager_->step();
}

} // namespace ddp::optim
