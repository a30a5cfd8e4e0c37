// Activation checkpointing (ddp::Checkpointed) composed with
// FullyShardedDataParallel and DistributedDataParallel: training with it
// must equal training without it (1e-6), dropout included, for every FSDP
// strategy, bf16 mixed precision, prefetching, a unit called twice in one
// forward and a model called twice before one backward, and DDP with and
// without find_unused_parameters. Each checkpointed module must have run
// its forward again in every backward.
//
// Two regressions from PyTorch's own reports, written from their
// descriptions:
//  - pytorch#159359: with mixed precision, the recomputation ran in another
//    dtype than the forward and failed; here it recomputes in the unit's
//    compute dtype and the results equal training without checkpointing.
//  - pytorch#187437: with several units and two forwards before one
//    backward, a unit was resharded before another checkpointed
//    recomputation needed it; here every recomputation finds its unit
//    gathered.
//
// Usage:
//   build/ddprun --nproc-per-node 3 build/tests/activation_checkpoint_main
// prints one line per case on each rank and "activation_checkpoint_main
// (rank R of W): N of N cases passed"; exits 1 if a case failed.

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

using ddp::ShardingStrategy;
using ddp_test::kHidden;
using ddp_test::kIn;
using ddp_test::kOut;
using ddp_test::Report;
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;
using ddp_test::state_difference;

constexpr double kTolerance = 1e-6;
constexpr int kSteps = 5;

// A pre-norm residual block with dropout: what a transformer block is to
// activation checkpointing (random masks, a LayerNorm, a residual).
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        a(register_module("a", torch::nn::Linear(kHidden, 2 * kHidden))),
        b(register_module("b", torch::nn::Linear(2 * kHidden, kHidden))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + drop(b(torch::gelu(a(ln(x))))); }
  torch::nn::LayerNorm ln;
  torch::nn::Linear a, b;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

// A block as a unit, checkpointed or not.
ddp::FsdpUnit unit_of_block(bool checkpointed) {
  return checkpointed ? ddp::FsdpUnit(ddp::Checkpointed(Block())) : ddp::FsdpUnit(Block());
}

// Three units, the middle one called twice per forward when `twice`, and a
// head outside every unit (the root unit) that is checkpointed too.
struct NetImpl : torch::nn::Module {
  NetImpl(bool checkpointed, bool twice)
      : twice(twice), first(register_module("first", ddp::FsdpUnit(torch::nn::Linear(kIn, kHidden)))),
        middle(register_module("middle", unit_of_block(checkpointed))),
        last(register_module("last", unit_of_block(checkpointed))) {
    torch::nn::Linear linear(kHidden, kOut);
    head = checkpointed ? torch::nn::AnyModule(ddp::Checkpointed(linear)) : torch::nn::AnyModule(linear);
    register_module("head", head.ptr());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = middle(torch::tanh(first(x)));
    if (twice) {
      h = middle(h);
    }
    return head.forward<torch::Tensor>(last(h));
  }
  bool twice;
  ddp::FsdpUnit first, middle, last;
  torch::nn::AnyModule head;
};
TORCH_MODULE(Net);

// The same seed on every rank for the weights (FSDP checks they agree).
Net make_net(bool checkpointed, bool twice) {
  torch::manual_seed(7);
  Net net(checkpointed, twice);
  return net;
}

// The checkpointed modules of `module`.
std::vector<std::shared_ptr<ddp::CheckpointedImpl>> checkpointed_in(torch::nn::Module& module) {
  std::vector<std::shared_ptr<ddp::CheckpointedImpl>> found;
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (auto c = std::dynamic_pointer_cast<ddp::CheckpointedImpl>(m)) {
      found.push_back(c);
    }
  }
  return found;
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return (output.to(torch::kFloat) - target).pow(2).mean();
}

// What one training run ends with.
struct Outcome {
  StateDict state;
  std::vector<double> losses;
  int64_t forwards = 0;
  int64_t recomputations = 0;
};

// kSteps of Adam on this rank's slice, the dropout masks from a seed of
// this rank's; `two_forwards`: two calls of the model (two slices of the
// batch) before one backward.
template <typename Model>
Outcome train(Model& model, torch::nn::Module& inner, ddp::ProcessGroup& group, bool two_forwards,
              const std::function<StateDict()>& state) {
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  torch::manual_seed(1000 + group.rank());
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    torch::Tensor loss;
    if (two_forwards) {
      const int64_t half = x.size(0) / 2;
      loss = mse(model(x.narrow(0, 0, half)), y.narrow(0, 0, half)) +
             mse(model(x.narrow(0, half, x.size(0) - half)), y.narrow(0, half, x.size(0) - half));
    } else {
      loss = mse(model(x), y);
    }
    loss.backward();
    optimizer.step();
    out.losses.push_back(loss.template item<double>());
  }
  out.state = state();
  for (const auto& c : checkpointed_in(inner)) {
    out.forwards += c->checkpointed_forwards();
    out.recomputations += c->recomputations();
  }
  return out;
}

void compare(Report& report, const Outcome& plain, const Outcome& checkpointed, size_t modules, int per_step) {
  report.expect_at_most(state_difference(plain.state, checkpointed.state), kTolerance, "parameters");
  double worst = 0;
  for (size_t i = 0; i < plain.losses.size(); ++i) {
    worst = std::max(worst, std::abs(plain.losses[i] - checkpointed.losses[i]));
  }
  report.expect_at_most(worst, kTolerance, "losses");
  const int64_t expected = static_cast<int64_t>(modules) * per_step * kSteps;
  report.expect(checkpointed.forwards == expected && checkpointed.recomputations == expected,
                "checkpointed forwards " + std::to_string(checkpointed.forwards) + " and recomputations " +
                    std::to_string(checkpointed.recomputations) + ", expected " + std::to_string(expected) +
                    " of each");
  report.note(std::to_string(checkpointed.recomputations) + " recomputations");
}

Outcome run_fsdp(ddp::ProcessGroup& group, bool checkpointed, bool twice, bool two_forwards,
                 const ddp::FullyShardedDataParallelOptions& options) {
  auto net = make_net(checkpointed, twice);
  ddp::FullyShardedDataParallel model(net, options);
  return train(model, *net, group, two_forwards, [&] {
    return model->full_state_dict(ddp::FullStateDictOptions().rank0_only(false));
  });
}

void fsdp_case(Report& report, ddp::ProcessGroup& group, const std::string& name,
               const ddp::FullyShardedDataParallelOptions& options, bool twice = false, bool two_forwards = false) {
  report.begin_case("fsdp " + name);
  const auto plain = run_fsdp(group, false, twice, two_forwards, options);
  const auto checkpointed = run_fsdp(group, true, twice, two_forwards, options);
  // Three checkpointed modules: two blocks and the head; the middle block
  // runs twice when `twice`; every module twice with two forwards.
  const int calls = (twice ? 4 : 3) * (two_forwards ? 2 : 1);
  compare(report, plain, checkpointed, 1, calls);
  report.end_case();
}

// A Sequential whose children are the units, two of them checkpointed.
torch::nn::Sequential make_sequential(bool checkpointed) {
  torch::manual_seed(11);
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(kIn, kHidden));
  for (int i = 0; i < 2; ++i) {
    if (checkpointed) {
      net->push_back(ddp::Checkpointed(Block()));
    } else {
      net->push_back(Block());
    }
  }
  net->push_back(torch::nn::Linear(kHidden, kOut));
  return net;
}

void sequential_case(Report& report, ddp::ProcessGroup& group, ShardingStrategy strategy) {
  report.begin_case(std::string("fsdp Sequential ") + ddp::to_string(strategy));
  Outcome outcomes[2];
  for (const bool checkpointed : {false, true}) {
    auto net = make_sequential(checkpointed);
    ddp::FullyShardedDataParallel model(net, ddp::FullyShardedDataParallelOptions().sharding_strategy(strategy));
    outcomes[checkpointed ? 1 : 0] = train(model, *net, group, false, [&] {
      return model->full_state_dict(ddp::FullStateDictOptions().rank0_only(false));
    });
  }
  compare(report, outcomes[0], outcomes[1], 2, 1);
  report.end_case();
}

void ddp_case(Report& report, ddp::ProcessGroup& group, bool find_unused, bool static_graph) {
  report.begin_case(std::string("ddp") + (find_unused ? " find_unused_parameters" : "") +
                    (static_graph ? " static_graph" : ""));
  Outcome outcomes[2];
  for (const bool checkpointed : {false, true}) {
    auto net = make_net(checkpointed, false);
    ddp::DistributedDataParallel model(
        net, ddp::DistributedDataParallelOptions().find_unused_parameters(find_unused).static_graph(static_graph));
    outcomes[checkpointed ? 1 : 0] = train(model, *net, group, false, [&] { return ddp::full_state_dict_of(*net); });
  }
  compare(report, outcomes[0], outcomes[1], 1, 3);
  report.end_case();
}

// A module holding a unit (a Checkpointed around a unit itself does not
// compile: that constructor is deleted).
struct HoldsAUnitImpl : torch::nn::Module {
  HoldsAUnitImpl() : unit(register_module("unit", ddp::FsdpUnit(torch::nn::Linear(2, 2)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return unit(x); }
  ddp::FsdpUnit unit;
};
TORCH_MODULE(HoldsAUnit);

void errors(Report& report) {
  report.begin_case("error: a unit inside a Checkpointed");
  ddp_test::expect_error(
      report, [] { ddp::Checkpointed c{HoldsAUnit()}; }, "put the Checkpointed inside the unit");
  report.end_case();
}

} // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    Report report("activation_checkpoint_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    using O = ddp::FullyShardedDataParallelOptions;
    fsdp_case(report, *group, "kFullShard", O());
    fsdp_case(report, *group, "kShardGradOp", O().sharding_strategy(ShardingStrategy::kShardGradOp));
    fsdp_case(report, *group, "kNoShard", O().sharding_strategy(ShardingStrategy::kNoShard));
    fsdp_case(report, *group, "kHybridShard", O().sharding_strategy(ShardingStrategy::kHybridShard));
    fsdp_case(report, *group, "kFullShard forward_prefetch", O().forward_prefetch(true));
    fsdp_case(report, *group, "kFullShard no backward_prefetch", O().backward_prefetch(false));
    // pytorch#159359: the recomputation in the unit's compute dtype.
    fsdp_case(report, *group, "kFullShard bf16 (pytorch#159359)",
              O().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16)));
    fsdp_case(report, *group, "kShardGradOp bf16 (pytorch#159359)",
              O().sharding_strategy(ShardingStrategy::kShardGradOp)
                  .mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16)));
    // pytorch#187437: two forwards before one backward, a unit called twice.
    fsdp_case(report, *group, "kFullShard a unit called twice", O(), /*twice=*/true);
    fsdp_case(report, *group, "kFullShard two forwards before backward (pytorch#187437)", O(), false, true);
    fsdp_case(report, *group, "kFullShard both (pytorch#187437)", O(), true, true);
    fsdp_case(report, *group, "kShardGradOp both (pytorch#187437)", O().sharding_strategy(ShardingStrategy::kShardGradOp),
              true, true);
    for (const auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
      sequential_case(report, *group, strategy);
    }
    ddp_case(report, *group, false, false);
    ddp_case(report, *group, true, false);
    ddp_case(report, *group, false, true);
    errors(report);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "activation_checkpoint_main: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
