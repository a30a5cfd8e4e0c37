#pragma once

/// SyncBatchNorm: batch normalisation whose training statistics are those of
/// the whole group's batch, and convert_sync_batchnorm, which puts it in
/// place of a model's BatchNorm layers (PyTorch's torch.nn.SyncBatchNorm).

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <ostream>

#include <ddp/comm/process_group.h>

namespace ddp::nn {

/// Options of `SyncBatchNorm`: the fields and defaults of
/// `torch::nn::BatchNormOptions`, and the group to synchronise over.
/// Example:
/// ```
/// ddp::nn::SyncBatchNorm bn(ddp::nn::SyncBatchNormOptions(64).momentum(0.01).process_group(group));
/// ddp::nn::SyncBatchNorm same_as(torch::nn::BatchNorm2dOptions(64).eps(1e-3));
/// ```
struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features);
  /// The fields of a BatchNorm's options, and the default group: a layer
  /// declared with `torch::nn::BatchNorm2dOptions(...)` keeps them.
  /* implicit */ SyncBatchNormOptions(const torch::nn::BatchNormOptions& options);

  /// The number of channels: dimension 1 of the input. Must be positive.
  TORCH_ARG(int64_t, num_features);
  /// Added to the variance before its square root. Default: 1e-5.
  TORCH_ARG(double, eps) = 1e-5;
  /// Weight of a batch's statistics in the running ones; `c10::nullopt`
  /// makes them the cumulative average of all batches (PyTorch's
  /// momentum=None). Default: 0.1.
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  /// Learn a per-channel scale (`weight`) and shift (`bias`). Default: true.
  TORCH_ARG(bool, affine) = true;
  /// Keep running statistics, and normalise with them in eval mode.
  /// Default: true.
  TORCH_ARG(bool, track_running_stats) = true;
  /// The group whose ranks' batches are normalised as one. Default:
  /// nullptr, the default group (`ddp::default_process_group()`) at the time
  /// of each training forward.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
};

namespace detail {
// What a SyncBatchNorm takes over from a BatchNorm (see the constructors
// that take one).
struct BatchNormState {
  SyncBatchNormOptions options;
  torch::Tensor weight;
  torch::Tensor bias;
  torch::Tensor running_mean;
  torch::Tensor running_var;
  torch::Tensor num_batches_tracked;
  bool training = true;
};
} // namespace detail

/// The module behind `SyncBatchNorm`: batch normalisation of 2-D to N-D
/// input (batch, channels, ...) for 1d, 2d and 3d alike, as PyTorch's
/// torch.nn.SyncBatchNorm.
///
/// In training mode the mean and variance of each channel are those of the
/// batches of all ranks of the group together, as if one process saw the
/// concatenated batch: each rank's count, mean and variance are gathered
/// with one `allgather_into_tensor` per forward, and backward allreduces
/// the two per-channel sums that the input's gradient needs, once per
/// backward. Ranks may hold batches of different sizes, including empty
/// ones (which still take part in both collectives). The running statistics
/// are updated from the group's statistics (the variance unbiased over the
/// group's count), so that they are the same on every rank. `weight` and
/// `bias` get this rank's share of their gradients: DistributedDataParallel
/// averages them, as for any parameter.
///
/// In eval mode (and with a group of one rank) it is exactly
/// `torch::nn::BatchNorm`, with no communication.
///
/// Unlike PyTorch's, which runs on CUDA only, it runs on every device and
/// backend: CPU tensors over Gloo or MPI, CUDA tensors over NCCL or Gloo.
///
/// Its parameters (`weight`, `bias`) and buffers (`running_mean`,
/// `running_var`, `num_batches_tracked`) are named and shaped as
/// `torch::nn::BatchNorm`'s, so that state dicts and checkpoints of either
/// load into the other. The public fields follow `torch::nn::BatchNorm`
/// (no trailing underscore), so that code written against it compiles.
///
/// A training forward is a collective, as is the backward through it: every
/// rank of the group must run them, in the same order as its other
/// collectives (this is what DistributedDataParallel's rules already ask).
/// Not for ranks that have left the loop under `ddp::Join`, which does not
/// shadow these collectives (nor does PyTorch's Join).
///
/// Thread-safety: as any module, not thread-safe; its backward runs on the
/// autograd engine's thread and waits there for the allreduce.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  /// Checks `options` (num_features > 0, eps >= 0) and creates fresh
  /// parameters (weight 1, bias 0) and statistics (mean 0, variance 1).
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);

  /// A SyncBatchNorm that takes over `batch_norm`: its options, its
  /// parameters and buffers (the same tensors, not copies, with their
  /// `requires_grad`), and its training flag. What convert_sync_batchnorm
  /// puts in place of a BatchNorm. (They take holders: a BatchNorm's Impl
  /// converts implicitly from BatchNormOptions, which would make
  /// `SyncBatchNorm(torch::nn::BatchNormOptions(...))` ambiguous.)
  explicit SyncBatchNormImpl(const torch::nn::BatchNorm1d& batch_norm,
                             std::shared_ptr<ProcessGroup> process_group = nullptr);
  explicit SyncBatchNormImpl(const torch::nn::BatchNorm2d& batch_norm,
                             std::shared_ptr<ProcessGroup> process_group = nullptr);
  explicit SyncBatchNormImpl(const torch::nn::BatchNorm3d& batch_norm,
                             std::shared_ptr<ProcessGroup> process_group = nullptr);

  /// Registers fresh parameters and buffers, as `torch::nn::BatchNorm` does.
  void reset() override;
  /// Running mean 0, running variance 1, num_batches_tracked 0.
  void reset_running_stats();
  /// `reset_running_stats()`, weight 1 and bias 0.
  void reset_parameters();

  /// Normalises `input` (batch, channels, ...). In training mode, with a
  /// group of more than one rank, a collective: see the class comment.
  torch::Tensor forward(const torch::Tensor& input);

  /// "ddp::nn::SyncBatchNorm(64, eps=1e-05, momentum=0.1, affine=true,
  /// track_running_stats=true)".
  void pretty_print(std::ostream& stream) const override;

  /// The options it was built with. Changing eps or momentum later takes
  /// effect at the next forward; the others do not.
  SyncBatchNormOptions options;
  /// Per-channel scale; undefined unless `affine`.
  torch::Tensor weight;
  /// Per-channel shift; undefined unless `affine`.
  torch::Tensor bias;
  /// Undefined unless `track_running_stats`.
  torch::Tensor running_mean;
  /// Undefined unless `track_running_stats`.
  torch::Tensor running_var;
  /// Training forwards so far (Long scalar); undefined unless
  /// `track_running_stats`.
  torch::Tensor num_batches_tracked;
  /// The layer's name in its model ("generator.batch_norm1"), which errors
  /// about its collectives, the flight recorder and the timeline show
  /// ("SyncBatchNorm 'generator.batch_norm1' forward"). convert_sync_batchnorm
  /// sets it; set it yourself for a layer you build. Default: "".
  std::string name_in_model;

 private:
  explicit SyncBatchNormImpl(detail::BatchNormState state);
};

/// A `ModuleHolder` of `SyncBatchNormImpl`: `ddp::nn::SyncBatchNorm bn(64);`.
TORCH_MODULE(SyncBatchNorm);

/// Puts a SyncBatchNorm over `process_group` (nullptr: the default group)
/// in place of every `torch::nn::BatchNorm1d`, `BatchNorm2d` and
/// `BatchNorm3d` of the module tree under `module`, as PyTorch's
/// `SyncBatchNorm.convert_sync_batchnorm`. Each SyncBatchNorm takes over
/// its BatchNorm's parameters and buffers (the same tensors), options and
/// training flag, under the same name, so that checkpoints of the model
/// still load and an optimizer made before the conversion still holds the
/// parameters. Returns `module`, converted in place, or a new SyncBatchNorm
/// when `module` itself is a BatchNorm. Call it before wrapping the model in
/// DistributedDataParallel. Existing SyncBatchNorms are left as they are.
///
/// The BatchNorms are replaced in `Sequential`, `ModuleList` and
/// `ModuleDict` containers (their contents and their registered children),
/// at any depth, also inside custom modules. A BatchNorm that a custom module
/// holds as its own member (`torch::nn::BatchNorm2d bn;`, called by that
/// module's forward) stays, a BatchNorm by type and name, and its training
/// forwards become SyncBatchNorm's, taken at the dispatcher (docs/ddp.md,
/// "SyncBatchNorm"), on the converting thread and in DDP's and FSDP's
/// forwards. Only such a member with neither weight nor running statistics
/// is refused (c10::Error naming it, nothing changed): use SyncBatchNorm.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const std::shared_ptr<torch::nn::Module>& module,
    std::shared_ptr<ProcessGroup> process_group = nullptr);

/// As above, for a module holder (`torch::nn::Sequential`, a
/// `TORCH_MODULE`, ...): converts it in place and returns it.
template <typename ModuleType>
torch::nn::ModuleHolder<ModuleType> convert_sync_batchnorm(
    torch::nn::ModuleHolder<ModuleType> module,
    std::shared_ptr<ProcessGroup> process_group = nullptr) {
  const auto converted = convert_sync_batchnorm(module.ptr(), std::move(process_group));
  TORCH_CHECK(converted == module.ptr(),
              "convert_sync_batchnorm: a holder of a BatchNorm cannot hold the SyncBatchNorm "
              "that replaces it; pass a torch::nn::BatchNorm1d, BatchNorm2d or BatchNorm3d "
              "(which returns a SyncBatchNorm) or its module pointer");
  return module;
}

/// As above, for a BatchNorm itself: a SyncBatchNorm that takes it over.
SyncBatchNorm convert_sync_batchnorm(const torch::nn::BatchNorm1d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group = nullptr);
SyncBatchNorm convert_sync_batchnorm(const torch::nn::BatchNorm2d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group = nullptr);
SyncBatchNorm convert_sync_batchnorm(const torch::nn::BatchNorm3d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group = nullptr);

} // namespace ddp::nn
