#pragma once

// Models for the static_graph tests: a reentrant activation checkpoint, as
// Python's torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=True), and
// TwiceNet, whose middle layer runs twice under it, so that the layer's
// gradient hooks fire twice in one backward (once in each nested backward).

#include <torch/torch.h>

#include <functional>
#include <utility>

#include "nn/closed_form.h"

namespace ddp_test {

using CheckpointedFn = std::function<torch::Tensor(const torch::Tensor&)>;

namespace detail {
// The function of a checkpoint, kept by its autograd context until backward.
struct CheckpointedFnHolder : torch::CustomClassHolder {
  explicit CheckpointedFnHolder(CheckpointedFn fn) : fn(std::move(fn)) {}
  CheckpointedFn fn;
};

// Forward runs `fn` without recording a graph; backward runs it again with
// one and calls backward on that, a nested backward in which the gradient
// accumulators of `fn`'s parameters run (what Python's reentrant
// CheckpointFunction does).
struct ReentrantCheckpoint : torch::autograd::Function<ReentrantCheckpoint> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                const torch::Tensor& input, CheckpointedFn fn) {
    context->saved_data["fn"] =
        c10::IValue::make_capsule(c10::make_intrusive<CheckpointedFnHolder>(fn));
    context->save_for_backward({input});
    torch::NoGradGuard no_grad;
    return {fn(input)};
  }

  // Runs on the autograd engine thread.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list gradients) {
    auto input = context->get_saved_variables()[0].detach().requires_grad_(true);
    const auto holder = c10::static_intrusive_pointer_cast<CheckpointedFnHolder>(
        context->saved_data["fn"].toCapsule());
    torch::Tensor output;
    {
      torch::AutoGradMode enable_grad(true);
      output = holder->fn(input);
    }
    torch::autograd::backward({output}, {gradients[0]});
    return {input.grad(), torch::Tensor()};
  }
};
} // namespace detail

/// `fn(input)`, recomputed in backward inside a nested backward.
inline torch::Tensor reentrant_checkpoint(const CheckpointedFn& fn, const torch::Tensor& input) {
  return detail::ReentrantCheckpoint::apply(input, fn)[0];
}

/// Must match pytorch_ddp_reference.py's TwiceNet: `shared` runs twice per
/// forward, each time under a reentrant checkpoint (`checkpointed` false:
/// twice without one, when its hooks fire once per backward).
struct TwiceNetImpl : torch::nn::Module {
  explicit TwiceNetImpl(bool checkpointed = true)
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        shared(register_module("shared", torch::nn::Linear(kHidden, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kOut))),
        checkpointed_(checkpointed) {}

  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc1(x));
    const CheckpointedFn block = [this](const torch::Tensor& t) { return torch::tanh(shared(t)); };
    for (int k = 0; k < 2; ++k) {
      h = checkpointed_ ? reentrant_checkpoint(block, h) : block(h);
    }
    return fc2(h);
  }

  torch::nn::Linear fc1, shared, fc2;

 private:
  bool checkpointed_;
};
TORCH_MODULE(TwiceNet);

} // namespace ddp_test
