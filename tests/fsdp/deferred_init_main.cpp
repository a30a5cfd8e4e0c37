// Deferred construction (ddp::deferred_unit) and seeded initialisation
// (ddp::seeded_init) under FullyShardedDataParallel: a model built unit by
// unit holds, bit for bit, the values of the same model built whole and
// sharded with the same seed, and trains to the same values; one unit's
// full parameters exist at a time; materialize builds the same model
// without FSDP; and the errors.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/deferred_init_main
// prints one line per case on each rank and "deferred_init_main (rank R of
// W): N of N cases passed"; exits 1 if a case failed.

#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "fsdp/fsdp_models.h"
#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::kHidden;
using ddp_test::kIn;
using ddp_test::kOut;
using ddp_test::Report;
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;
using ddp_test::state_difference;

constexpr int kBlocks = 4;

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        a(register_module("a", torch::nn::Linear(kHidden, 3 * kHidden))),
        b(register_module("b", torch::nn::Linear(3 * kHidden, kHidden))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + b(torch::gelu(a(ln(x)))); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear a, b;
};
TORCH_MODULE(Block);

// Every block built so far (by the factories of deferred units), to check
// that the earlier ones were sharded (their parameters emptied) before the
// next is built.
struct Builds {
  std::vector<Block> blocks;
  bool earlier_all_sharded = true;
};

struct NetImpl : torch::nn::Module {
  NetImpl(bool deferred, std::shared_ptr<Builds> builds)
      : in(register_module("in", torch::nn::Linear(kIn, kHidden))),
        out(register_module("out", torch::nn::Linear(kHidden, kOut))) {
    for (int i = 0; i < kBlocks; ++i) {
      ddp::FsdpUnit unit = deferred ? ddp::deferred_unit([builds] {
        for (const auto& earlier : builds->blocks) {
          for (const auto& p : earlier->parameters()) {
            builds->earlier_all_sharded = builds->earlier_all_sharded && p.numel() == 0;
          }
        }
        Block block;
        builds->blocks.push_back(block);
        return block;
      })
                                    : ddp::FsdpUnit(Block());
      blocks.push_back(register_module("block" + std::to_string(i), unit));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(in(x));
    for (auto& block : blocks) {
      h = block(h);
    }
    return out(h);
  }
  torch::nn::Linear in, out;
  std::vector<ddp::FsdpUnit> blocks;
};
TORCH_MODULE(Net);

void train(const std::function<torch::Tensor(const torch::Tensor&)>& forward, torch::optim::Optimizer& optimizer,
           int rank, int world) {
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, rank, world);
    optimizer.zero_grad();
    (forward(x) - y).pow(2).mean().backward();
    optimizer.step();
  }
}

void same_values(Report& report, ddp::ProcessGroup& group, const ddp::ParamInit& init, const std::string& name) {
  report.begin_case("deferred equals eager, " + name);
  auto builds = std::make_shared<Builds>();
  Net eager_net(false, nullptr);
  ddp::FullyShardedDataParallel eager(eager_net, ddp::FullyShardedDataParallelOptions().param_init(init));
  Net deferred_net(true, builds);
  ddp::FullyShardedDataParallel deferred(deferred_net, ddp::FullyShardedDataParallelOptions().param_init(init));
  report.expect(builds->blocks.size() == kBlocks, "built " + std::to_string(builds->blocks.size()) + " blocks");
  report.expect(builds->earlier_all_sharded, "a unit was built before the one before it was sharded");
  report.expect_at_most(state_difference(eager->full_state_dict(), deferred->full_state_dict()), 0, "initial values");
  // Each rank holds its shards only: the blocks' own tensors are empty.
  int64_t left = 0;
  for (const auto& block : builds->blocks) {
    for (const auto& p : block->parameters()) {
      left += p.numel();
    }
  }
  report.expect(left == 0, std::to_string(left) + " elements of the built blocks outside the shards");
  torch::optim::Adam a(eager->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam b(deferred->parameters(), torch::optim::AdamOptions(1e-2));
  train([&](const torch::Tensor& x) { return eager(x); }, a, group.rank(), group.size());
  train([&](const torch::Tensor& x) { return deferred(x); }, b, group.rank(), group.size());
  report.expect_at_most(state_difference(eager->full_state_dict(), deferred->full_state_dict()), 0, "after 5 steps");
  report.end_case();
}

// One process, the model built whole and seeded_init'ed, trains the whole
// batch to where the deferred FSDP model trains the ranks' slices.
void against_one_process(Report& report, ddp::ProcessGroup& group) {
  report.begin_case("deferred FSDP equals one process");
  const auto init = ddp::ParamInit().seed(99);
  Net plain(false, nullptr);
  ddp::seeded_init(*plain, init);
  Net net(true, std::make_shared<Builds>());
  ddp::FullyShardedDataParallel model(net, ddp::FullyShardedDataParallelOptions().param_init(init));
  report.expect_at_most(state_difference(ddp::full_state_dict_of(*plain), model->full_state_dict()), 0,
                        "initial values");
  torch::optim::Adam a(plain->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam b(model->parameters(), torch::optim::AdamOptions(1e-2));
  train([&](const torch::Tensor& x) { return plain(x); }, a, 0, 1);
  train([&](const torch::Tensor& x) { return model(x); }, b, group.rank(), group.size());
  report.expect_at_most(state_difference(ddp::full_state_dict_of(*plain), model->full_state_dict()), 1e-5,
                        "after 5 steps");
  report.end_case();
}

void materialized(Report& report) {
  report.begin_case("materialize equals seeded_init");
  const auto init = ddp::ParamInit().seed(3);
  Net eager(false, nullptr);
  ddp::seeded_init(*eager, init);
  Net deferred(true, std::make_shared<Builds>());
  ddp::materialize(*deferred, init);
  report.expect_at_most(state_difference(ddp::full_state_dict_of(*eager), ddp::full_state_dict_of(*deferred)), 0,
                        "values");
  // Another seed, other values; LibTorch's distribution: a Linear's weight
  // within +-1/sqrt(fan_in).
  Net other(false, nullptr);
  ddp::seeded_init(*other, ddp::ParamInit().seed(4));
  report.expect(state_difference(ddp::full_state_dict_of(*eager), ddp::full_state_dict_of(*other)) > 0,
                "seeds 3 and 4 gave the same values");
  const double bound = 1.0 / std::sqrt(static_cast<double>(kHidden));
  const double largest = eager->blocks[0]->module()->as<BlockImpl>()->a->weight.abs().max().item<double>();
  report.expect(largest <= bound && largest > bound / 2, "a Linear(16, 48)'s weights reach " +
                                                             std::to_string(largest) + ", bound " +
                                                             std::to_string(bound));
  report.end_case();
}

void errors(Report& report) {
  report.begin_case("error: a deferred unit without param_init");
  ddp_test::expect_error(
      report, [] { ddp::FullyShardedDataParallel model(Net(true, std::make_shared<Builds>())); },
      "pass FullyShardedDataParallelOptions().param_init");
  report.end_case();
  report.begin_case("error: a deferred unit called before it is built");
  ddp_test::expect_error(
      report, [] { Net(true, std::make_shared<Builds>())->forward(torch::ones({2, kIn})); },
      "is not built yet");
  report.end_case();
  report.begin_case("error: a module reset_parameters does not know");
  struct Custom : torch::nn::Module {
    Custom() { register_parameter("w", torch::ones({2})); }
  };
  ddp_test::expect_error(
      report, [] { Custom custom; ddp::seeded_init(custom, ddp::ParamInit()); }, "pass a ModuleInit");
  report.end_case();
}

} // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    Report report("deferred_init_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    same_values(report, *group, ddp::ParamInit().seed(5), "reset_parameters");
    // A user init: GPT-2's normal(0, 0.02) for the Linears.
    same_values(report, *group,
                ddp::ParamInit().seed(6).init([](torch::nn::Module& m, const std::string& path) {
                  if (auto* linear = m.as<torch::nn::Linear>()) {
                    linear->weight.normal_(0.0, path.find(".b") != std::string::npos ? 0.01 : 0.02);
                    linear->bias.zero_();
                  } else {
                    ddp::reset_parameters(m, path);
                  }
                }),
                "a user init");
    against_one_process(report, *group);
    materialized(report);
    errors(report);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deferred_init_main: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
