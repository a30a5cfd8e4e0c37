// FullyShardedDataParallel against one process on the whole batch: W ranks,
// each training on its slice of the global batch and holding 1/W of every
// parameter, must end with the parameters of plain training, after 5 and
// after 20 steps, for a Sequential of six units and a custom module of
// three FsdpUnits plus a root parameter, SGD and Adam, every strategy.
// Also: no_sync, prefetching, mixed precision, clip_grad_norm, full states
// in both directions, and the errors.
//
// Usage:
//   build/ddprun --nproc-per-node 3 build/tests/fsdp_main
// prints one line per case on each rank, e.g.
//   [rank 0]: [ok] parity mlp6 kFullShard Adam: after 5 steps 2.98e-08
//             (tolerance 1e-05), after 20 steps 5.96e-08 (tolerance 1e-05)
// (on one line) and "fsdp_main (rank R of W): N of N cases passed"; exits 1
// if a case failed. Run alone it is a world of size 1.

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
using ddp_test::Report;
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;
using ddp_test::state_difference;

constexpr double kTolerance = 1e-5;

struct Optim {
  std::string name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> make;
};

std::vector<Optim> optimizers() {
  return {
      {"SGD",
       [](std::vector<torch::Tensor> p) {
         return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(
             std::move(p), torch::optim::SGDOptions(0.05).momentum(0.9)));
       }},
      {"Adam",
       [](std::vector<torch::Tensor> p) {
         return std::unique_ptr<torch::optim::Optimizer>(
             std::make_unique<torch::optim::Adam>(std::move(p), torch::optim::AdamOptions(1e-2)));
       }},
  };
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return (output.to(torch::kFloat) - target).pow(2).mean();
}

StateDict gathered(ddp::FullyShardedDataParallel& model) {
  return model->full_state_dict(ddp::FullStateDictOptions().rank0_only(false));
}

// The models, built the same way for the reference and for FSDP.
struct Model {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> make_plain;
  std::function<ddp::FullyShardedDataParallel(const ddp::FullyShardedDataParallelOptions&)> make_fsdp;
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)> call_plain;
};

std::vector<Model> models() {
  return {
      {"mlp6", [] { return ddp_test::make_six_unit_mlp().ptr(); },
       [](const ddp::FullyShardedDataParallelOptions& o) {
         return ddp::FullyShardedDataParallel(ddp_test::make_six_unit_mlp(), o);
       },
       [](torch::nn::Module& m, const torch::Tensor& x) {
         return dynamic_cast<torch::nn::SequentialImpl&>(m).forward(x);
       }},
      {"three-unit", [] { return ddp_test::ThreeUnitNet().ptr(); },
       [](const ddp::FullyShardedDataParallelOptions& o) {
         return ddp::FullyShardedDataParallel(ddp_test::ThreeUnitNet(), o);
       },
       [](torch::nn::Module& m, const torch::Tensor& x) {
         return dynamic_cast<ddp_test::ThreeUnitNetImpl&>(m).forward(x);
       }},
  };
}

// One process, the plain optimizer, the whole batch: steps [first, last).
void train_plain(const Model& model, torch::nn::Module& net, torch::optim::Optimizer& optimizer, int first,
                 int last, double clip = 0) {
  for (int step = first; step < last; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    optimizer.zero_grad();
    mse(model.call_plain(net, x), y).backward();
    if (clip > 0) {
      torch::nn::utils::clip_grad_norm_(net.parameters(), clip);
    }
    optimizer.step();
  }
}

// This rank's slice: steps [first, last).
void train_fsdp(ddp::FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer, ddp::ProcessGroup& group,
                int first, int last, double clip = 0) {
  for (int step = first; step < last; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    mse(model(x), y).backward();
    if (clip > 0) {
      model->clip_grad_norm(clip);
    }
    optimizer.step();
  }
}

struct Variant {
  std::string name;
  ddp::FullyShardedDataParallelOptions options;
  double tolerance = kTolerance;
  double clip = 0;
};

void parity(Report& report, ddp::ProcessGroup& group, const Model& model, const Optim& optim,
            const Variant& variant) {
  report.begin_case("parity " + model.name + " " + variant.name + " " + optim.name);
  auto reference = model.make_plain();
  auto reference_optimizer = optim.make(reference->parameters());
  auto fsdp = model.make_fsdp(variant.options);
  auto optimizer = optim.make(fsdp->parameters());
  int done = 0;
  for (int steps : {5, 20}) {
    train_plain(model, *reference, *reference_optimizer, done, steps, variant.clip);
    train_fsdp(fsdp, *optimizer, group, done, steps, variant.clip);
    done = steps;
    report.expect_at_most(state_difference(gathered(fsdp), ddp::full_state_dict_of(*reference)), variant.tolerance,
                          "after " + std::to_string(steps) + " steps");
  }
  // Each rank holds its shard: at most ceil(T / W) elements per unit.
  int64_t held = 0, total = 0;
  for (const auto& p : fsdp->parameters()) {
    held += p.numel();
  }
  for (const auto& p : reference->parameters()) {
    total += p.numel();
  }
  const auto sharded = variant.options.sharding_strategy() == ShardingStrategy::kFullShard ||
                       variant.options.sharding_strategy() == ShardingStrategy::kShardGradOp;
  const int64_t bound = sharded ? total / group.size() + static_cast<int64_t>(fsdp->num_units()) : total;
  report.expect(held <= bound, "this rank holds " + std::to_string(held) + " elements, more than " +
                                   std::to_string(bound));
  report.note("holds " + std::to_string(held) + " of " + std::to_string(total));
  report.end_case();
}

// Gradient accumulation: two micro-batches per step, the first under
// no_sync, against one process on the same rows.
void no_sync(Report& report, ddp::ProcessGroup& group, ShardingStrategy strategy) {
  report.begin_case(std::string("no_sync ") + ddp::to_string(strategy));
  const int w = group.size();
  const int64_t per_rank = ddp_test::kGlobalBatch / w;
  auto reference = ddp_test::make_six_unit_mlp();
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto net = ddp_test::make_six_unit_mlp();
  ddp::FullyShardedDataParallel model(net, ddp::FullyShardedDataParallelOptions().sharding_strategy(strategy));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 6; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    // Micro-batch m of rank r: rows r * per_rank + [m * half, (m + 1) * half).
    const int64_t half = per_rank / 2;
    auto rows = [&](int m, int r) { return torch::arange(r * per_rank + m * half, r * per_rank + (m + 1) * half); };
    reference_optimizer.zero_grad();
    for (int m = 0; m < 2; ++m) {
      std::vector<torch::Tensor> all;
      for (int r = 0; r < w; ++r) {
        all.push_back(rows(m, r));
      }
      auto index = torch::cat(all);
      mse(reference->forward(x.index_select(0, index)), y.index_select(0, index)).backward();
    }
    reference_optimizer.step();
    optimizer.zero_grad();
    {
      auto guard = model->no_sync();
      mse(model(x.index_select(0, rows(0, group.rank()))), y.index_select(0, rows(0, group.rank()))).backward();
    }
    mse(model(x.index_select(0, rows(1, group.rank()))), y.index_select(0, rows(1, group.rank()))).backward();
    optimizer.step();
  }
  report.expect_at_most(state_difference(gathered(model), ddp::full_state_dict_of(*reference)), kTolerance,
                        "after 6 steps of 2 micro-batches");
  report.end_case();
}

// bfloat16 parameters and reduction, fp32 shards, against the same mixed
// precision by hand in one process: fp32 master parameters, a bfloat16
// copy that computes forward and backward on the whole batch, its
// gradients stepping the master. Equal on every rank.
void mixed_precision(Report& report, ddp::ProcessGroup& group, ShardingStrategy strategy) {
  report.begin_case(std::string("mixed precision bf16 ") + ddp::to_string(strategy));
  const auto all = models();
  const Model& model = all[0];
  auto master = model.make_plain();
  auto compute = model.make_plain();
  compute->to(torch::kBFloat16);
  auto fp32 = model.make_plain();
  const auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9);
  torch::optim::SGD master_optimizer(master->parameters(), sgd);
  torch::optim::SGD fp32_optimizer(fp32->parameters(), sgd);
  auto fsdp = model.make_fsdp(ddp::FullyShardedDataParallelOptions().sharding_strategy(strategy).mixed_precision(
      ddp::MixedPrecision().param_dtype(torch::kBFloat16)));
  torch::optim::SGD optimizer(fsdp->parameters(), sgd);
  constexpr int kSteps = 10;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    {
      torch::NoGradGuard no_grad;
      auto from = master->parameters();
      auto to = compute->parameters();
      for (size_t i = 0; i < from.size(); ++i) {
        to[i].copy_(from[i]);
      }
    }
    compute->zero_grad();
    mse(model.call_plain(*compute, x.to(torch::kBFloat16)), y).backward();
    {
      auto from = compute->parameters();
      auto to = master->parameters();
      for (size_t i = 0; i < from.size(); ++i) {
        to[i].mutable_grad() = from[i].grad().to(torch::kFloat);
      }
    }
    master_optimizer.step();
  }
  train_plain(model, *fp32, fp32_optimizer, 0, kSteps);
  train_fsdp(fsdp, optimizer, group, 0, kSteps);
  const auto state = gathered(fsdp);
  bool float32 = true;
  for (const auto& item : state) {
    float32 = float32 && item.value().scalar_type() == torch::kFloat;
  }
  report.expect(float32, "the full state is not float32 (the master shards)");
  // One process sums the gradient in float32 inside the backward's matrix
  // products, W ranks sum W bfloat16 gradients (8 bits of mantissa, a
  // relative error of 2^-9 per addition): ~1e-3 after 10 steps.
  report.expect_at_most(state_difference(state, ddp::full_state_dict_of(*master)), 2e-3,
                        "against bf16 by hand in one process");
  report.note("against fp32 " + Report::format(state_difference(state, ddp::full_state_dict_of(*fp32))));
  std::vector<torch::Tensor> values;
  for (const auto& item : state) {
    values.push_back(item.value());
  }
  report.expect_at_most(ddp_test::max_difference_from_rank0(group, values), 0, "across ranks");
  report.end_case();
}

// full_state_dict into a plain module and back into FSDP.
void full_state(Report& report, ddp::ProcessGroup& group) {
  report.begin_case("full state round trip");
  const auto all = models();
  for (const Model& model : all) {
    auto fsdp = model.make_fsdp({});
    torch::optim::Adam optimizer(fsdp->parameters(), torch::optim::AdamOptions(1e-2));
    train_fsdp(fsdp, optimizer, group, 0, 3);
    const auto on_rank0 = fsdp->full_state_dict(ddp::FullStateDictOptions().rank0_only(true));
    report.expect(group.rank() == 0 ? on_rank0.size() > 0 : on_rank0.size() == 0,
                  "rank0_only: rank " + std::to_string(group.rank()) + " got " + std::to_string(on_rank0.size()) +
                      " tensors");
    const auto state = gathered(fsdp);
    // Into a plain module in one process: same outputs.
    auto plain = model.make_plain();
    ddp::load_full_state_dict(*plain, state);
    auto [x, y] = ddp_test::global_batch(7);
    auto [rx, ry] = ddp_test::rank_batch(7, group.rank(), group.size());
    torch::Tensor expected, got;
    {
      torch::NoGradGuard no_grad;
      expected = model.call_plain(*plain, x);
      got = fsdp(rx);
    }
    const int64_t per_rank = ddp_test::kGlobalBatch / group.size();
    report.expect_at_most((expected.narrow(0, group.rank() * per_rank, per_rank) - got).abs().max().item<double>(),
                          kTolerance, model.name + " plain outputs");
    // Back into a fresh FSDP model, changed first: the same state again.
    auto fresh = model.make_fsdp({});
    {
      torch::NoGradGuard no_grad;
      for (auto& p : fresh->parameters()) {
        p.fill_(0.5);
      }
    }
    fresh->load_full_state_dict(state);
    report.expect_at_most(state_difference(gathered(fresh), state), 0, model.name + " reloaded");
  }
  report.end_case();
}

// Errors: every rank gets a clear c10::Error, none hangs.
template <typename Fn>
void expect_error(Report& report, const std::string& name, const std::string& needle, Fn fn) {
  report.begin_case("error: " + name);
  try {
    fn();
    report.expect(false, "no error");
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    report.expect(text.find(needle) != std::string::npos, "message lacks '" + needle + "': " + text);
  }
  report.end_case();
}

struct NestedImpl : torch::nn::Module {
  NestedImpl() : inner(register_module("inner", ddp::FsdpUnit(torch::nn::Linear(4, 4)))) {}
  torch::Tensor forward(torch::Tensor x) { return inner(x); }
  ddp::FsdpUnit inner;
};
TORCH_MODULE(Nested);

struct OuterImpl : torch::nn::Module {
  OuterImpl() : outer(register_module("outer", ddp::FsdpUnit(Nested()))) {}
  torch::Tensor forward(torch::Tensor x) { return outer(x); }
  ddp::FsdpUnit outer;
};
TORCH_MODULE(Outer);

struct SharedImpl : torch::nn::Module {
  SharedImpl() {
    torch::nn::Linear layer(4, 4);
    a = register_module("a", ddp::FsdpUnit(layer));
    b = register_module("b", ddp::FsdpUnit(layer));
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)); }
  ddp::FsdpUnit a{nullptr}, b{nullptr};
};
TORCH_MODULE(Shared);

void errors(Report& report, ddp::ProcessGroup& group) {
  if (group.size() > 1) {
    expect_error(report, "units differ across ranks", "ranks wrap different units", [&] {
      torch::nn::Sequential net(torch::nn::Linear(4, group.rank() == 1 ? 5 : 6), torch::nn::Linear(6, 2));
      ddp::FullyShardedDataParallel model(net);
    });
  }
  expect_error(report, "nested units", "units must not nest", [] { ddp::FullyShardedDataParallel model{Outer()}; });
  expect_error(report, "a parameter shared between units", "is shared between unit",
               [] { ddp::FullyShardedDataParallel model{Shared()}; });
  expect_error(report, "a unit called outside the forward", "outside the forward", [] {
    ddp_test::ThreeUnitNet net;
    ddp::FullyShardedDataParallel model(net);
    net->first(torch::ones({2, ddp_test::kIn}));
  });
  expect_error(report, "a state that does not fit", "missing keys: 0.weight, 0.bias", [] {
    ddp::FullyShardedDataParallel model(ddp_test::make_six_unit_mlp());
    model->load_full_state_dict(StateDict());
  });
}

// kHybridShard over explicit groups: nodes of `node` consecutive ranks.
ddp::FullyShardedDataParallelOptions hybrid(ddp::ProcessGroup& group, int node) {
  const int w = group.size();
  std::shared_ptr<ddp::ProcessGroup> shard, replicate;
  for (int k = 0; k < w / node; ++k) {
    std::vector<int> ranks;
    for (int r = k * node; r < (k + 1) * node; ++r) {
      ranks.push_back(r);
    }
    auto made = ddp::new_group(ranks);
    if (group.rank() / node == k) {
      shard = made;
    }
  }
  for (int position = 0; position < node; ++position) {
    std::vector<int> ranks;
    for (int r = position; r < w; r += node) {
      ranks.push_back(r);
    }
    auto made = ddp::new_group(ranks);
    if (group.rank() % node == position) {
      replicate = made;
    }
  }
  return ddp::FullyShardedDataParallelOptions()
      .sharding_strategy(ShardingStrategy::kHybridShard)
      .shard_group(shard)
      .replicate_group(replicate);
}

} // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    Report report("fsdp_main (rank " + std::to_string(group->rank()) + " of " + std::to_string(group->size()) + ")");
    using O = ddp::FullyShardedDataParallelOptions;
    std::vector<Variant> variants = {
        {"kFullShard", O()},
        {"kShardGradOp", O().sharding_strategy(ShardingStrategy::kShardGradOp)},
    };
    for (const auto& model : models()) {
      for (const auto& variant : variants) {
        for (const auto& optim : optimizers()) {
          parity(report, *group, model, optim, variant);
        }
      }
    }
    const auto adam = optimizers()[1];
    const auto all = models();
    std::vector<Variant> more = {
        {"kNoShard", O().sharding_strategy(ShardingStrategy::kNoShard)},
        {"kFullShard forward_prefetch", O().forward_prefetch(true)},
        {"kFullShard no backward_prefetch", O().backward_prefetch(false)},
        {"kFullShard clip_grad_norm 0.05", O(), kTolerance, 0.05},
        // On the CPU the shards are in host memory already: the option
        // changes nothing, which this checks (tests/gpu for a GPU).
        {"kFullShard cpu_offload", O().cpu_offload(ddp::CPUOffload().offload_params(true)), kTolerance, 0.05},
        // Nodes of W / 2 ranks when the world size W is even (2 ranks:
        // replicated, not sharded), of the whole world otherwise.
        {"kHybridShard", hybrid(*group, group->size() % 2 == 0 ? group->size() / 2 : group->size())},
    };
    // The groups made from the launcher's ranks per node (one node here:
    // sharded over all, replicated nowhere).
    more.push_back({"kHybridShard from the local world size", O().sharding_strategy(ShardingStrategy::kHybridShard)});
    for (const auto& model : all) {
      for (const auto& variant : more) {
        parity(report, *group, model, adam, variant);
      }
    }
    no_sync(report, *group, ShardingStrategy::kFullShard);
    no_sync(report, *group, ShardingStrategy::kShardGradOp);
    mixed_precision(report, *group, ShardingStrategy::kFullShard);
    mixed_precision(report, *group, ShardingStrategy::kShardGradOp);
    full_state(report, *group);
    errors(report, *group);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_main: %s\n", e.what());
    return 1;
  }
}
