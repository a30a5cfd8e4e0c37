#pragma once

// What convert_sync_batchnorm (sync_batch_norm.cpp) and the BatchNorms it
// synchronises where they stand (batch_norm_in_place.cpp) share (private
// header). See Note [BatchNorms synchronised in place].

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>

#include <ddp/comm/process_group.h>

namespace ddp::nn::detail {

// SyncBatchNorm's training forward over `group` (of more than one rank):
// the group's statistics, the running ones (undefined: not tracked) moved
// by `momentum` (this step's factor), the output differentiable through
// SyncBatchNorm's backward. `weight` and `bias` may be undefined (not
// affine). `name` labels its collectives.
at::Tensor sync_batch_norm_training(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                    const at::Tensor& running_mean, const at::Tensor& running_var,
                                    double momentum, double eps, std::shared_ptr<ProcessGroup> group,
                                    const std::string& name);

// Whether `batch_norm` (a torch::nn::BatchNorm1d, 2d or 3d) can be
// synchronised where it stands: a tensor of its own identifies its calls
// (its weight, or its running mean).
bool can_synchronise_in_place(const torch::nn::Module& batch_norm);

// Installs, once per process, the dispatcher hook that the BatchNorms
// synchronised in place need; throws, naming the layer `name` that needed
// it, when it cannot be installed (another library holds the dispatch key).
void install_batch_norm_hook(const std::string& name);

// Makes every training forward of `batch_norm` (see can_synchronise_in_place)
// a SyncBatchNorm's over `group` (nullptr: the default group at each
// forward), its collectives labelled with `name`, on this thread and on
// those that enable_batch_norms_in_place() reaches. Throws, naming `name`,
// when the dispatcher hook cannot be installed.
void synchronise_in_place(const std::shared_ptr<torch::nn::Module>& batch_norm,
                          std::shared_ptr<ProcessGroup> group, const std::string& name);

// Once some BatchNorm is synchronised in place, makes this thread's
// batch_norm calls go through the hook (DistributedDataParallel's and
// FullyShardedDataParallel's forward call it); otherwise does nothing.
void enable_batch_norms_in_place();

} // namespace ddp::nn::detail
