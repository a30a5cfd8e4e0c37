// FullyShardedDataParallel's auto-wrap policies: the units they choose in
// nested custom modules and Sequentials (module type, parameter count,
// explicit units left as they are, a Sequential model), and training with
// those units equals one process training the whole batch.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/auto_wrap_main
// prints one line per case on each rank and "auto_wrap_main (rank R of W):
// N of N cases passed"; exits 1 if a case failed.

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "fsdp/fsdp_models.h"
#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::BlockImpl;
using ddp_test::kHidden;
using ddp_test::kIn;
using ddp_test::kOut;
using ddp_test::Report;
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;
using ddp_test::state_difference;

// Two Blocks in a Sequential, held as a member: "blocks.0", "blocks.1".
struct StageImpl : torch::nn::Module {
  StageImpl() : blocks(register_module("blocks", torch::nn::Sequential(ddp_test::Block(), ddp_test::Block()))) {}
  torch::Tensor forward(const torch::Tensor& x) { return blocks->forward(x); }
  torch::nn::Sequential blocks;
};
TORCH_MODULE(Stage);

// body: Sequential(Linear [0], Tanh [1], Stage [2], Block [3]); head: a
// Linear, or an explicit FsdpUnit around one.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool explicit_head)
      : body(register_module("body", torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh(),
                                                            Stage(), ddp_test::Block()))) {
    torch::nn::Linear linear(kHidden, kOut);
    head = torch::nn::AnyModule(linear);
    if (explicit_head) {
      unit = register_module("head", ddp::FsdpUnit(linear));
    } else {
      register_module("head", linear);
    }
    ddp_test::init_closed_form(*this);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = body->forward(x);
    return unit ? unit(h) : head.forward<torch::Tensor>(h);
  }
  torch::nn::Sequential body;
  torch::nn::AnyModule head;
  ddp::FsdpUnit unit{nullptr};
};
TORCH_MODULE(Net);

torch::nn::Sequential make_sequential() {
  torch::nn::Sequential net(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh(), Stage(), ddp_test::Block(),
                            torch::nn::Linear(kHidden, kOut));
  ddp_test::init_closed_form(*net);
  return net;
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return (output - target).pow(2).mean();
}

std::string joined(std::vector<std::string> items) {
  std::sort(items.begin(), items.end());
  std::string out;
  for (const auto& item : items) {
    out += (out.empty() ? "" : ", ") + item;
  }
  return out;
}

// The units `model` chose are `expected` (in any order); 5 steps of Adam on
// this rank's slice equal 5 on the whole batch in one process.
void check(Report& report, ddp::ProcessGroup& group, const std::string& name, ddp::FullyShardedDataParallel& model,
           torch::nn::Module& plain, const std::function<torch::Tensor(const torch::Tensor&)>& plain_forward,
           const std::vector<std::string>& expected) {
  report.begin_case(name);
  std::vector<std::string> labels;
  for (size_t u = 0; u < model->num_units(); ++u) {
    labels.push_back(model->unit_label(u));
  }
  report.expect(joined(labels) == joined(expected), "units " + joined(labels) + ", expected " + joined(expected));
  report.note("units " + joined(labels));
  torch::optim::Adam reference(plain.parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    reference.zero_grad();
    mse(plain_forward(x), y).backward();
    reference.step();
    auto [xr, yr] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    mse(model(xr), yr).backward();
    optimizer.step();
  }
  report.expect_at_most(state_difference(model->full_state_dict(), ddp::full_state_dict_of(plain)), 1e-5,
                        "after 5 steps");
  report.end_case();
}

void custom_case(Report& report, ddp::ProcessGroup& group, const std::string& name, const ddp::AutoWrapPolicy& policy,
                 bool explicit_head, const std::vector<std::string>& expected) {
  Net plain(explicit_head);
  Net net(explicit_head);
  ddp::FullyShardedDataParallel model(net, ddp::FullyShardedDataParallelOptions().auto_wrap_policy(policy));
  check(report, group, name, model, *plain, [&](const torch::Tensor& x) { return plain(x); }, expected);
}

} // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    Report report("auto_wrap_main (rank " + std::to_string(group->rank()) + " of " + std::to_string(group->size()) +
                  ")");
    // Every Block, at any depth of the model's Sequentials.
    custom_case(report, *group, "module_wrap_policy<Block>", ddp::module_wrap_policy<BlockImpl>(), false,
                {"body.2.blocks.0", "body.2.blocks.1", "body.3", "(root)"});
    // Blocks hold 544 elements, the Stage 1088: at 1000 the Stage is a unit,
    // its Blocks are not; the rest is the root unit.
    custom_case(report, *group, "size_based_auto_wrap_policy(1000)", ddp::size_based_auto_wrap_policy(1000), false,
                {"body.2", "(root)"});
    // At 500, the Blocks (bottom-up first); the Stage then holds units.
    custom_case(report, *group, "size_based_auto_wrap_policy(500)", ddp::size_based_auto_wrap_policy(500), false,
                {"body.2.blocks.0", "body.2.blocks.1", "body.3", "(root)"});
    // An explicit unit stays as it is (the head); a policy for Linear
    // chooses the one Linear that is a Sequential's child.
    custom_case(report, *group, "explicit units win", ddp::module_wrap_policy<torch::nn::LinearImpl>(), true,
                {"body.0", "head", "(root)"});
    // A Sequential model: the policy chooses among its children, and inside
    // those it leaves out.
    {
      auto plain = make_sequential();
      auto net = make_sequential();
      ddp::FullyShardedDataParallel model(
          net, ddp::FullyShardedDataParallelOptions().auto_wrap_policy(ddp::module_wrap_policy<BlockImpl>()));
      check(report, *group, "a Sequential model, module_wrap_policy<Block>", model, *plain,
            [&](const torch::Tensor& x) { return plain->forward(x); }, {"2.blocks.0", "2.blocks.1", "child 3", "(root)"});
    }
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "auto_wrap_main: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
