// Activation checkpointing (activation_checkpoint.h).
//
// How it works. A custom autograd Function takes the input and the wrapped
// module's parameters as its inputs, so that its graph node has an edge to
// each parameter's gradient accumulator. Its forward runs the module under
// NoGradGuard (no activations kept) after saving the input and the random
// generators' states (the CPU one, and the input's GPU's). Its backward, on
// the autograd engine's thread, sets those states (and puts back the ones
// it found after), runs the module's forward again with gradients enabled
// on a detached copy of the input, and asks autograd for the gradients of
// that output with respect to the input copy and the parameters; it returns
// them, and the engine hands each parameter's gradient to its accumulator,
// where DDP's reducer and FSDP's units wait for it, exactly as without
// checkpointing. Under FSDP the unit's pre-backward hook, on the Function's
// output, has gathered the unit's parameters again before this backward
// runs, and the unit is freed once its gradients are reduced.

#include <ddp/nn/activation_checkpoint.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <ddp/nn/fully_sharded_data_parallel.h>

#include "internal/check.h"

namespace ddp {

namespace {

// The module, kept alive by the graph until its backward ran.
struct ModuleCapsule : torch::CustomClassHolder {
  explicit ModuleCapsule(std::shared_ptr<CheckpointedImpl> module) : module(std::move(module)) {}
  std::shared_ptr<CheckpointedImpl> module;
};

// The random generators a forward may draw from: the CPU's and, for an
// input on a GPU, that GPU's.
std::vector<at::Generator> generators_for(const at::Tensor& input) {
  std::vector<at::Generator> out{at::detail::getDefaultCPUGenerator()};
  if (!input.device().is_cpu()) {
    out.push_back(at::globalContext().defaultGenerator(input.device()));
  }
  return out;
}

} // namespace

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input,
                            at::TensorList parameters, const c10::IValue& capsule) {
    auto& self = *c10::static_intrusive_pointer_cast<ModuleCapsule>(capsule.toCapsule())->module;
    context->saved_data["module"] = capsule;
    context->saved_data["parameters"] = static_cast<int64_t>(parameters.size());
    context->saved_data["input_requires_grad"] = input.requires_grad();
    std::vector<at::Tensor> states;
    for (auto& generator : generators_for(input)) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      states.push_back(generator.get_state());
    }
    context->saved_data["rng_states"] = c10::List<at::Tensor>(states);
    context->save_for_backward({input});
    ++self.forwards_;
    at::NoGradGuard no_grad;
    return self.any_.forward<at::Tensor>(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    auto capsule = c10::static_intrusive_pointer_cast<ModuleCapsule>(context->saved_data["module"].toCapsule());
    CheckpointedImpl& self = *capsule->module;
    DDP_CHECK(!at::GradMode::is_enabled(), "Checkpointed: double backward (create_graph=true) is not supported");
    const at::Tensor saved = context->get_saved_variables()[0];
    const auto count = static_cast<size_t>(context->saved_data["parameters"].toInt());
    const bool input_requires_grad = context->saved_data["input_requires_grad"].toBool();
    const auto saved_states = context->saved_data["rng_states"].toTensorList();

    // The forward again, with the random state it had.
    auto generators = generators_for(saved);
    std::vector<at::Tensor> current;
    for (size_t i = 0; i < generators.size(); ++i) {
      std::lock_guard<std::mutex> lock(generators[i].mutex());
      current.push_back(generators[i].get_state());
      generators[i].set_state(saved_states.get(i));
    }
    at::Tensor input = saved.detach().requires_grad_(input_requires_grad);
    at::Tensor output;
    try {
      at::AutoGradMode enable_grad(true);
      output = self.any_.forward<at::Tensor>(input);
    } catch (...) {
      for (size_t i = 0; i < generators.size(); ++i) {
        std::lock_guard<std::mutex> lock(generators[i].mutex());
        generators[i].set_state(current[i]);
      }
      throw;
    }
    for (size_t i = 0; i < generators.size(); ++i) {
      std::lock_guard<std::mutex> lock(generators[i].mutex());
      generators[i].set_state(current[i]);
    }
    ++self.recomputations_;

    // Gradients of what requires them: the input, the parameters.
    const auto parameters = self.module_->parameters();
    DDP_INTERNAL_ASSERT(parameters.size() == count, "the checkpointed module's parameters changed between "
                                                    "forward and backward");
    std::vector<at::Tensor> wrt;
    std::vector<size_t> slot; // where each gradient goes in the result
    if (input_requires_grad) {
      wrt.push_back(input);
      slot.push_back(0);
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (parameters[i].requires_grad()) {
        wrt.push_back(parameters[i]);
        slot.push_back(1 + i);
      }
    }
    torch::autograd::variable_list result(2 + count);
    if (!wrt.empty() && output.requires_grad()) {
      const auto computed = torch::autograd::grad({output}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < computed.size(); ++k) {
        result[slot[k]] = computed[k];
      }
    }
    return result;
  }
};

void CheckpointedImpl::check_wrappable() const {
  for (const auto& m : module_->modules(/*include_self=*/true)) {
    DDP_CHECK(dynamic_cast<const FsdpUnitImpl*>(m.get()) == nullptr,
              "Checkpointed: the wrapped module contains a ddp::FsdpUnit; put the Checkpointed inside the unit "
              "instead (ddp::FsdpUnit(ddp::Checkpointed(block))): FSDP gathers a unit around its forward, and "
              "the recomputation runs in the unit's backward");
  }
}

torch::Tensor CheckpointedImpl::forward(const torch::Tensor& input) {
  if (!is_training() || !at::GradMode::is_enabled()) {
    return any_.forward<at::Tensor>(input);
  }
  auto self = std::static_pointer_cast<CheckpointedImpl>(shared_from_this());
  const auto parameters = module_->parameters();
  return CheckpointFunction::apply(input, at::TensorList(parameters),
                                   c10::IValue::make_capsule(c10::make_intrusive<ModuleCapsule>(std::move(self))));
}

} // namespace ddp
