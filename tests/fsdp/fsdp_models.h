#pragma once

// The models of the FullyShardedDataParallel tests: a Sequential MLP of six
// Linear units, and a custom module of three FsdpUnits plus a parameter of
// its own (the root unit). Weights in closed form (tests/nn/closed_form.h),
// so that every rank and the one-process reference start equal.

#include <torch/torch.h>

#include <ddp/ddp.h>

#include "nn/closed_form.h"

namespace ddp_test {

/// Six Linear layers, activations between them: units "child 0", "child 2",
/// ... "child 10".
inline torch::nn::Sequential make_six_unit_mlp() {
  torch::nn::Sequential net(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh(),
                            torch::nn::Linear(kHidden, kHidden), torch::nn::ReLU(),
                            torch::nn::Linear(kHidden, kHidden), torch::nn::Tanh(),
                            torch::nn::Linear(kHidden, kHidden), torch::nn::ReLU(),
                            torch::nn::Linear(kHidden, kHidden), torch::nn::Tanh(),
                            torch::nn::Linear(kHidden, kOut));
  init_closed_form(*net);
  return net;
}

/// Two Linear layers, one unit.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : a(register_module("a", torch::nn::Linear(kHidden, kHidden))),
        b(register_module("b", torch::nn::Linear(kHidden, kHidden))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::tanh(b(torch::relu(a(x)))); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(Block);

/// Three units and a parameter outside them (`scale`, in the root unit).
/// Linear(16, 4) has 68 elements: uneven shards on 3 ranks.
struct ThreeUnitNetImpl : torch::nn::Module {
  ThreeUnitNetImpl()
      : first(register_module("first", ddp::FsdpUnit(torch::nn::Linear(kIn, kHidden)))),
        middle(register_module("middle", ddp::FsdpUnit(Block()))),
        last(register_module("last", ddp::FsdpUnit(torch::nn::Linear(kHidden, kOut)))),
        scale(register_parameter("scale", torch::ones({kOut}))) {
    init_closed_form(*this);
  }
  torch::Tensor forward(torch::Tensor x) { return last(middle(torch::tanh(first(x)))) * (scale + 1.0); }
  ddp::FsdpUnit first, middle, last;
  torch::Tensor scale;
};
TORCH_MODULE(ThreeUnitNet);

/// The largest absolute difference between two full states (compared on
/// the CPU, in float64); 1e30 when their names or shapes differ.
inline double state_difference(const torch::OrderedDict<std::string, torch::Tensor>& a,
                               const torch::OrderedDict<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) {
    return 1e30;
  }
  double worst = 0;
  for (const auto& item : a) {
    const auto* other = b.find(item.key());
    if (other == nullptr || other->sizes() != item.value().sizes()) {
      return 1e30;
    }
    worst = std::max(worst, (item.value().to(torch::kCPU, torch::kDouble) - other->to(torch::kCPU, torch::kDouble))
                                .abs()
                                .max()
                                .item<double>());
  }
  return worst;
}

} // namespace ddp_test
