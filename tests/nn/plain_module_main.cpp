// Modules as PyTorch's own C++ examples write them, `struct Net :
// torch::nn::Module` without TORCH_MODULE, made with std::make_shared or held
// by value, under DistributedDataParallel and FullyShardedDataParallel; a
// FsdpUnit model's state loading into the same model without units; FSDP
// refusing initial values that differ across ranks. Run under ddprun with 2
// ranks and alone; every case trains against one process on the whole batch.
// Prints "plain_module_main: N of N cases passed".

#include <torch/torch.h>

#include <cstdio>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

// Upstream MNIST's shape: layers registered in the constructor, a plain
// forward.
struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut));
    ddp_test::init_closed_form(*this);
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// The same network with its layers in FsdpUnits.
struct UnitNet : torch::nn::Module {
  UnitNet() {
    fc1 = register_module("fc1", ddp::FsdpUnit(torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden)));
    fc2 = register_module("fc2", ddp::FsdpUnit(torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut)));
    ddp_test::init_closed_form(*this);
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  ddp::FsdpUnit fc1{nullptr}, fc2{nullptr};
};

// Trains `forward` (this rank's batches) and `reference` (the whole batch,
// one process) 3 steps with SGD; returns the largest difference of their
// parameters at the end, by name (`names` maps a reference name to the
// trained one).
template <typename Forward>
double train_against_reference(ddp::ProcessGroup& group, Forward forward, std::vector<at::Tensor> params,
                               const std::function<ddp::StateDict()>& trained_state) {
  auto reference = std::make_shared<Net>();
  torch::optim::SGD ours(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD theirs(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    ours.zero_grad();
    torch::mse_loss(forward(x), y).backward();
    ours.step();
    auto [gx, gy] = ddp_test::global_batch(step);
    theirs.zero_grad();
    torch::mse_loss(reference->forward(gx), gy).backward();
    theirs.step();
  }
  const auto state = trained_state();
  double worst = 0;
  for (const auto& item : ddp::module_state_dict(*reference)) {
    const at::Tensor* mine = state.find(item.key());
    if (mine == nullptr) {
      return 1e30;
    }
    worst = std::max(worst, (mine->to(torch::kDouble) - item.value().to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

} // namespace

int main() {
  auto group = ddp::init_process_group(ddp::InitOptions().backend(ddp::Backend::kGloo));
  torch::set_num_threads(1);
  ddp_test::Report report("plain_module_main");

  report.begin_case("DDP over std::make_shared<Net>()");
  {
    auto net = std::make_shared<Net>();
    ddp::DistributedDataParallel model(net);
    report.expect(model->module() == net, "DDP does not share the module it was given");
    report.expect_at_most(
        train_against_reference(
            *group, [&](const torch::Tensor& x) { return model(x); }, net->parameters(),
            [&] { return ddp::module_state_dict(*net); }),
        1e-6, "max difference from one process");
  }
  report.end_case();

  report.begin_case("DDP over a Net held by value");
  {
    Net net;
    ddp::DistributedDataParallel model(net);
    report.expect(model->module().get() == &net, "DDP does not wrap the object it was given");
    report.expect_at_most(
        train_against_reference(
            *group, [&](const torch::Tensor& x) { return model(x); }, net.parameters(),
            [&] { return ddp::module_state_dict(net); }),
        1e-6, "max difference from one process");
  }
  report.end_case();

  report.begin_case("FSDP over std::make_shared<Net>() (one root unit)");
  {
    ddp::FullyShardedDataParallel model(std::make_shared<Net>());
    report.expect_at_most(
        train_against_reference(
            *group, [&](const torch::Tensor& x) { return model(x); }, model->parameters(),
            [&] { return model->full_state_dict(); }),
        1e-6, "max difference from one process");
  }
  report.end_case();

  report.begin_case("FSDP over FsdpUnits: its state loads into the model without units");
  {
    ddp::FullyShardedDataParallel model(std::make_shared<UnitNet>());
    const double difference = train_against_reference(
        *group, [&](const torch::Tensor& x) { return model(x); }, model->parameters(),
        [&] { return model->full_state_dict(); });
    report.expect_at_most(difference, 1e-6, "max difference from one process, by PyTorch's names");
    const auto state = model->full_state_dict();
    report.expect(state.keys() == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"},
                  "the full state's names carry a wrapper level: " + c10::Join(", ", state.keys()));
    Net plain;
    ddp::load_module_state_dict(plain, state); // strict: every name matches
    auto [x, y] = ddp_test::global_batch(9);
    torch::NoGradGuard no_grad;
    const double outputs = (plain.forward(x) - model(x)).abs().max().item<double>();
    report.expect_at_most(outputs, 0, "outputs of the loaded plain model against the trained one");
  }
  report.end_case();

  report.begin_case("FSDP refuses initial values that differ across ranks");
  if (group->size() > 1) {
    ddp_test::expect_error(
        report,
        [&] {
          auto net = std::make_shared<Net>();
          torch::NoGradGuard no_grad;
          net->fc2->bias.add_(group->rank()); // rank 1's fc2.bias differs
          ddp::FullyShardedDataParallel model(net);
        },
        "the ranks' initial values differ, first at 'fc2.bias' (rank 1 against rank 0)");
    auto net = std::make_shared<Net>();
    {
      torch::NoGradGuard no_grad;
      net->fc1->weight.add_(group->rank());
    }
    ddp::FullyShardedDataParallel model(net, ddp::FullyShardedDataParallelOptions().sync_module_states(true));
    const auto state = model->full_state_dict();
    report.expect(at::equal(state["fc1.weight"], Net().fc1->weight), "sync_module_states did not take rank 0's");
  } else {
    report.note("one rank: nothing can differ");
  }
  report.end_case();

  ddp::destroy_process_group();
  return report.finish();
}
