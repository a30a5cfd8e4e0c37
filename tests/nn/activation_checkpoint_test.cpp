// ddp::Checkpointed in one process: the gradients of the input and of the
// parameters equal the wrapped module's own, dropout draws the same masks
// in the recomputation, the forward keeps no activations of the module,
// eval mode and NoGradGuard call the module directly, and state dicts
// leave the wrapper's level out.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : a(register_module("a", torch::nn::Linear(6, 12))), b(register_module("b", torch::nn::Linear(12, 6))),
        drop(register_module("drop", torch::nn::Dropout(0.5))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + drop(b(torch::gelu(a(x)))); }
  torch::nn::Linear a, b;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

// The gradients of (input, parameters...) after backward of sum(f(x)^2).
std::vector<torch::Tensor> gradients(const std::function<torch::Tensor(const torch::Tensor&)>& f,
                                     torch::nn::Module& module, const torch::Tensor& x0) {
  module.zero_grad();
  auto x = x0.clone().requires_grad_(true);
  f(x).pow(2).sum().backward();
  std::vector<torch::Tensor> out{x.grad().clone()};
  for (const auto& p : module.parameters()) {
    out.push_back(p.grad().clone());
  }
  return out;
}

TEST(Checkpointed, GradientsEqualTheModulesOwnWithDropout) {
  torch::manual_seed(0);
  Block block;
  ddp::Checkpointed wrapped(block);
  const auto x = torch::randn({5, 6});
  torch::manual_seed(42);
  const auto plain = gradients([&](const torch::Tensor& in) { return block(in); }, *block, x);
  const auto after_plain = torch::rand({3});
  torch::manual_seed(42);
  const auto checkpointed = gradients([&](const torch::Tensor& in) { return wrapped(in); }, *block, x);
  const auto after_checkpointed = torch::rand({3});
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], checkpointed[i])) << "gradient " << i;
  }
  // The recomputation put back the generator's state it found: what is
  // drawn next is what is drawn after training without checkpointing.
  EXPECT_TRUE(torch::equal(after_plain, after_checkpointed));
  EXPECT_EQ(wrapped->checkpointed_forwards(), 1);
  EXPECT_EQ(wrapped->recomputations(), 1);
}

TEST(Checkpointed, KeepsOnlyItsInputForBackward) {
  torch::manual_seed(0);
  ddp::Checkpointed wrapped{Block()};
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto y = wrapped(x);
  // The output's node is the checkpoint's: the module's own nodes (Linear,
  // gelu, dropout) were not recorded.
  ASSERT_TRUE(y.grad_fn());
  const std::string name = y.grad_fn()->name();
  EXPECT_NE(name.find("CheckpointFunction"), std::string::npos) << name;
  for (const auto& edge : y.grad_fn()->next_edges()) {
    if (edge.function) {
      const std::string next = edge.function->name();
      EXPECT_TRUE(next.find("AccumulateGrad") != std::string::npos) << next;
    }
  }
}

TEST(Checkpointed, EvalAndNoGradCallTheModule) {
  torch::manual_seed(0);
  ddp::Checkpointed wrapped{Block()};
  const auto x = torch::randn({2, 6}, torch::requires_grad());
  {
    torch::NoGradGuard no_grad;
    wrapped(x);
  }
  wrapped->eval();
  auto y = wrapped(x);
  EXPECT_EQ(wrapped->checkpointed_forwards(), 0);
  const std::string name = y.grad_fn()->name();
  EXPECT_EQ(name.find("CheckpointFunction"), std::string::npos) << name;
}

TEST(Checkpointed, StateDictsLeaveTheWrapperOut) {
  torch::nn::Sequential net(ddp::Checkpointed(Block()), torch::nn::Linear(6, 2));
  const auto state = ddp::full_state_dict_of(*net);
  std::vector<std::string> keys;
  for (const auto& item : state) {
    keys.push_back(item.key());
  }
  const std::vector<std::string> expected{"0.a.weight", "0.a.bias", "0.b.weight", "0.b.bias", "1.weight", "1.bias"};
  EXPECT_EQ(keys, expected);
}

TEST(Checkpointed, InputWithoutGradientStillTrainsTheModule) {
  torch::manual_seed(0);
  ddp::Checkpointed wrapped(torch::nn::Linear(3, 2));
  auto x = torch::randn({4, 3});
  wrapped(x).sum().backward();
  for (const auto& p : wrapped->parameters()) {
    ASSERT_TRUE(p.grad().defined());
  }
  EXPECT_TRUE(torch::allclose(wrapped->parameters()[1].grad(), torch::full({2}, 4.0)));
}

// A module holding a unit (a Checkpointed around a unit itself does not
// compile: that constructor is deleted).
struct HoldsAUnitImpl : torch::nn::Module {
  HoldsAUnitImpl() : unit(register_module("unit", ddp::FsdpUnit(torch::nn::Linear(2, 2)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return unit(x); }
  ddp::FsdpUnit unit;
};
TORCH_MODULE(HoldsAUnit);

TEST(Checkpointed, RefusesAUnitInside) {
  try {
    ddp::Checkpointed c{HoldsAUnit()};
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("inside the unit"), std::string::npos);
  }
}

} // namespace
