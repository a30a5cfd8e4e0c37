#pragma once

/// Activation checkpointing (PyTorch's `checkpoint_wrapper` /
/// `torch.utils.checkpoint`): a module whose forward keeps no activations
/// and recomputes them in backward, trading compute (one more forward of
/// the module) for memory (only its input is kept). Composes with
/// DistributedDataParallel and FullyShardedDataParallel (put it inside the
/// unit: `ddp::FsdpUnit(ddp::Checkpointed(Block()))`, or as a child of a
/// wrapped Sequential), with mixed precision, and with dropout: the random
/// state of the forward is restored for the recomputation, so that it
/// draws the same masks (PyTorch's `preserve_rng_state`).
///
/// ```
/// torch::nn::Sequential net(ddp::Checkpointed(Block()), ddp::Checkpointed(Block()), torch::nn::Linear(64, 10));
/// ddp::FullyShardedDataParallel model(net);   // each checkpointed block a unit
/// ```

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <memory>

namespace ddp {

class FsdpUnitImpl;

/// The module behind `Checkpointed`.
///
/// In training mode with gradients enabled, forward runs the wrapped module
/// without recording a graph, keeps its input and the random generators'
/// states, and returns an output whose backward (on the autograd engine's
/// thread) restores those states, runs the module's forward again with a
/// graph, and backpropagates through it: the parameters' gradients reach
/// their accumulators as without checkpointing (DDP's and FSDP's hooks see
/// them there). In eval mode, or under NoGradGuard, it is the wrapped
/// module. One tensor in, one tensor out. The wrapped module must not
/// contain a `ddp::FsdpUnit` (refused at construction): FSDP gathers a unit
/// around its forward, so the unit goes outside.
///
/// State dicts leave its level out ("block.module.weight" in LibTorch's
/// names is "block.weight" in every state dict and checkpoint), as PyTorch
/// leaves out `_checkpoint_wrapped_module`.
///
/// Thread-safety: as any module.
class CheckpointedImpl : public torch::nn::Module {
 public:
  template <typename ModuleType>
  explicit CheckpointedImpl(const torch::nn::ModuleHolder<ModuleType>& module)
      : any_(module), module_(register_module("module", module.ptr())) {
    check_wrappable();
  }

  /// A unit is not wrapped: put the Checkpointed inside the unit instead,
  /// `ddp::FsdpUnit(ddp::Checkpointed(block))` (FSDP gathers a unit around
  /// its forward; the recomputation runs in the unit's backward).
  explicit CheckpointedImpl(const torch::nn::ModuleHolder<FsdpUnitImpl>& unit) = delete;

  /// The wrapped module's forward, recomputed in backward (see the class).
  torch::Tensor forward(const torch::Tensor& input);

  /// The wrapped module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  /// How many forwards ran with checkpointing, and how many recomputations
  /// their backward ran (for tests and insight).
  int64_t checkpointed_forwards() const { return forwards_; }
  int64_t recomputations() const { return recomputations_; }

 private:
  friend struct CheckpointFunction;
  void check_wrappable() const;

  torch::nn::AnyModule any_;
  std::shared_ptr<torch::nn::Module> module_;
  int64_t forwards_ = 0;
  int64_t recomputations_ = 0;
};

/// A holder of `CheckpointedImpl`: `ddp::Checkpointed block(Block());`.
TORCH_MODULE(Checkpointed);

} // namespace ddp
