#include "hooks.h"

#include <cstdio>

namespace mnist {

CommHooks::CommHooks(const Flags& flags, ddp::DistributedDataParallel& model)
    : flags_(flags), world_size_(model->process_group()->size()) {
  // The stateful hooks' state (PowerSGD's error feedback and Q memories,
  // post-local SGD's step count) goes into save_checkpoint with the model.
  if (flags.comm_hook == "powersgd") {
    powersgd_ = std::make_shared<ddp::comm_hooks::PowerSGDState>(
        ddp::comm_hooks::PowerSGDOptions()
            .matrix_approximation_rank(flags.powersgd_rank)
            .start_powerSGD_iter(flags.powersgd_start_iter));
    model->register_comm_hook(ddp::comm_hooks::powerSGD(powersgd_));
  } else if (flags.comm_hook == "localsgd") {
    // Gradients averaged over every rank for start_iter steps, then within
    // groups (a node's ranks by default); every `period` steps the averager
    // averages the parameters over every rank. As in PyTorch's example, the
    // averager's warmup is the hook's start.
    std::shared_ptr<ddp::ProcessGroup> subgroup;
    if (flags.local_sgd_group_size > 0) {
      subgroup = ddp::new_subgroups(static_cast<int>(flags.local_sgd_group_size)).mine;
    }
    local_sgd_ = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, subgroup,
                                                                      flags.local_sgd_start_iter);
    model->register_comm_hook(ddp::comm_hooks::post_localSGD(local_sgd_));
    averager_ = std::make_shared<ddp::model_averaging::PeriodicModelAverager>(flags.local_sgd_period,
                                                                              flags.local_sgd_start_iter);
  } else if (flags.comm_hook == "fp16") {
    model->register_comm_hook(ddp::comm_hooks::fp16_compress());
  } else if (flags.comm_hook == "bf16") {
    model->register_comm_hook(ddp::comm_hooks::bf16_compress());
  }
}

std::unique_ptr<torch::optim::Optimizer> CommHooks::wrap_optimizer(std::unique_ptr<torch::optim::Optimizer> sgd) {
  if (!averager_) {
    return sgd;
  }
  return std::make_unique<ddp::optim::PostLocalSGDOptimizer>(std::move(sgd), averager_);
}

void CommHooks::end_of_epoch(const std::vector<torch::Tensor>& parameters) {
  if (averager_) {
    ddp::model_averaging::average_parameters(parameters);
    ++epoch_averagings_;
  }
}

void CommHooks::report(const torch::nn::Module& module) const {
  // What the default hook sends: every gradient, once per step.
  int64_t numel = 0;
  for (const auto& p : module.parameters()) {
    numel += p.numel();
  }
  const int64_t plain = numel * 4;
  if (powersgd_) {
    const auto stats = powersgd_->compression_stats();
    const auto steps_done = std::max<int64_t>(powersgd_->iteration(), 1);
    std::printf("powersgd: %llu bytes allreduced in %lld steps (%.0f per step; the default hook: "
                "%lld per step); compression rate %.1f once started (step %lld)\n",
                static_cast<unsigned long long>(powersgd_->bytes_allreduced()),
                static_cast<long long>(powersgd_->iteration()),
                static_cast<double>(powersgd_->bytes_allreduced()) / static_cast<double>(steps_done),
                static_cast<long long>(plain), stats.rate, static_cast<long long>(flags_.powersgd_start_iter));
  }
  if (averager_) {
    // Over every rank: the gradients of the global steps, then one
    // parameter average per period. Within the groups: the gradients.
    const int64_t steps = averager_->step();
    const int64_t warmup = flags_.local_sgd_start_iter;
    // The averager averages at steps warmup, warmup + period, ... below `steps`.
    const int64_t averagings =
        (steps > warmup ? (steps - warmup - 1) / flags_.local_sgd_period + 1 : 0) + epoch_averagings_;
    const int64_t global_steps = local_sgd_->iteration();
    const int64_t across = global_steps * plain + averagings * plain;
    const auto group = local_sgd_->subgroup();
    std::printf("localsgd: %lld bytes averaged over all %d ranks in %lld steps (%.0f per step; the default "
                "hook: %lld per step, %.0f%% saved), %lld global steps then every %lld steps; gradients "
                "within groups of %d rank%s after that\n",
                static_cast<long long>(across), world_size_, static_cast<long long>(steps),
                static_cast<double>(across) / static_cast<double>(std::max<int64_t>(steps, 1)),
                static_cast<long long>(plain),
                100.0 * (1.0 - static_cast<double>(across) / static_cast<double>(std::max<int64_t>(steps, 1) * plain)),
                static_cast<long long>(global_steps), static_cast<long long>(flags_.local_sgd_period),
                group ? group->size() : 0, group && group->size() == 1 ? "" : "s");
  }
}

} // namespace mnist
