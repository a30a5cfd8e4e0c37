// ZeroRedundancyOptimizer under DistributedDataParallel against one process
// with the plain optimizer on the whole batch: W ranks, each training on its
// slice of the global batch and holding 1/W of the optimizer state, must
// end with the parameters of plain training, after 5 and after 20 steps.
// Also: the shard each rank holds, checkpoints in both directions (ZeRO on
// W ranks to a plain optimizer, a plain optimizer to ZeRO on W ranks, ZeRO
// on W ranks to ZeRO on W - 1), and the errors.
//
// Usage:
//   build/ddprun --nproc-per-node 3 build/tests/zero_main <scratch dir>
// prints one line per case on each rank, e.g.
//   [rank 0]: [ok] parity Adam: after 5 steps 2.98e-08 (tolerance 1e-05),
//             after 20 steps 5.96e-08 (tolerance 1e-05)
// (on one line) and "zero_main (rank R of W): N of N cases passed"; exits 1
// if a case failed. Run alone it is a world of size 1.

#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::Report;
using torch::optim::OptimizerParamGroup;
using Zero = ddp::optim::ZeroRedundancyOptimizerBase;

// Float32 sums in a different order; 20 steps move a weight by ~1e-2.
constexpr double kTolerance = 1e-5;
constexpr int kShortRun = 5;
constexpr int kLongRun = 20;

// An optimizer configuration, as a plain optimizer and as ZeRO over the
// same groups. The two-group configurations put the first two Linear
// layers (4 parameters) in group 0 and the rest in group 1.
struct Config {
  std::string name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<OptimizerParamGroup>)> plain;
  std::function<std::unique_ptr<Zero>(std::vector<OptimizerParamGroup>,
                                      const ddp::optim::ZeroRedundancyOptimizerOptions&)>
      zero;
  bool two_groups = false;
  bool bucket_view = false;
  double tolerance = kTolerance;
};

template <typename OptimizerType, typename Options>
Config make_config(std::string name, Options defaults, bool two_groups = false,
                   bool bucket_view = false, double second_lr = 0) {
  Config config;
  config.name = std::move(name);
  config.two_groups = two_groups;
  config.bucket_view = bucket_view;
  auto with_second_lr = [defaults, second_lr](std::vector<OptimizerParamGroup> groups) {
    if (groups.size() == 2 && second_lr > 0) {
      auto options = std::make_unique<Options>(defaults);
      options->lr(second_lr);
      groups[1].set_options(std::move(options));
    }
    return groups;
  };
  config.plain = [defaults, with_second_lr](std::vector<OptimizerParamGroup> groups) {
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<OptimizerType>(with_second_lr(std::move(groups)), defaults));
  };
  config.zero = [defaults, with_second_lr](std::vector<OptimizerParamGroup> groups,
                                           const ddp::optim::ZeroRedundancyOptimizerOptions& options) {
    return std::unique_ptr<Zero>(std::make_unique<ddp::optim::ZeroRedundancyOptimizer<OptimizerType>>(
        with_second_lr(std::move(groups)), defaults, options));
  };
  return config;
}

std::vector<Config> configs() {
  using namespace torch::optim;
  // RMSprop's first steps move each weight by about lr * g / |g| * 10: a
  // sign, which turns the float32 rounding of a gradient summed over ranks
  // (1e-7 relative) into up to 8e-5 (seen on 3 ranks, and the same for DDP
  // with plain RMSprop): against one process it gets a looser bound, and is
  // held to DDP with plain RMSprop exactly, like every configuration.
  auto rmsprop = make_config<RMSprop>("RMSprop", RMSpropOptions(1e-2).momentum(0.3));
  rmsprop.tolerance = 2e-4;
  return {
      make_config<Adam>("Adam", AdamOptions(1e-2)),
      make_config<AdamW>("AdamW", AdamWOptions(1e-2).weight_decay(0.1)),
      make_config<SGD>("SGD momentum weight_decay", SGDOptions(0.05).momentum(0.9).weight_decay(1e-3)),
      make_config<Adam>("Adam two groups", AdamOptions(1e-2), true, false, 3e-3),
      make_config<Adam>("Adam two groups bucket_view", AdamOptions(1e-2), true, true, 3e-3),
      make_config<SGD>("SGD bucket_view", SGDOptions(0.05).momentum(0.5), false, true),
      make_config<Adagrad>("Adagrad", AdagradOptions(0.05)),
      rmsprop,
  };
}

std::vector<OptimizerParamGroup> groups_of(const torch::nn::Module& module, bool two_groups) {
  auto params = module.parameters();
  if (!two_groups) {
    return {OptimizerParamGroup(params)};
  }
  return {OptimizerParamGroup(std::vector<torch::Tensor>(params.begin(), params.begin() + 4)),
          OptimizerParamGroup(std::vector<torch::Tensor>(params.begin() + 4, params.end()))};
}

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return (output - target).pow(2).mean();
}

// One process, the plain optimizer, the whole batch: steps [first, last).
void train_plain(torch::nn::Sequential& net, torch::optim::Optimizer& optimizer, int first, int last) {
  for (int step = first; step < last; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    optimizer.zero_grad();
    mse(net->forward(x), y).backward();
    optimizer.step();
  }
}

// This rank's slice under DDP and ZeRO: steps [first, last).
void train_zero(ddp::DistributedDataParallel& model, torch::optim::Optimizer& optimizer, int first,
                int last) {
  const auto& group = *model->process_group();
  for (int step = first; step < last; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    mse(model->forward(x), y).backward();
    optimizer.step();
  }
}

ddp::DistributedDataParallelOptions ddp_options(std::shared_ptr<ddp::ProcessGroup> group = nullptr) {
  return ddp::DistributedDataParallelOptions().process_group(std::move(group));
}

// How a parity case runs: without overlap (the default), or with the
// steps overlapped with DDP's backward (ZeroRedundancyOptimizer::
// overlap_with), under these DDP options and communication hook.
struct Overlap {
  std::string name;
  ddp::DistributedDataParallelOptions ddp;
  ddp::CommHook hook = nullptr;
  double tolerance = 0; // against one process, when looser than the configuration's
  int stage = 1;
};

// Bucket caps of 104 bytes: each bias and the next weight share a bucket,
// so the MLP has 4 buckets and 3 of them are stepped during backward.
ddp::DistributedDataParallelOptions tiny_buckets() {
  return ddp::DistributedDataParallelOptions().first_bucket_cap_mb(0.0001).bucket_cap_mb(0.0001);
}

void parity(Report& report, ddp::ProcessGroup& group, const Config& config,
            const std::optional<Overlap>& overlap = std::nullopt) {
  report.begin_case("parity " + config.name + (overlap ? ", overlapped, " + overlap->name : ""));
  const auto options = overlap ? overlap->ddp : ddp_options();
  auto reference_net = ddp_test::make_closed_form_mlp();
  auto reference = config.plain(groups_of(*reference_net, config.two_groups));
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, options);
  const int stage = overlap ? overlap->stage : 1;
  auto zero = config.zero(groups_of(*net, config.two_groups),
                          ddp::optim::ZeroRedundancyOptimizerOptions()
                              .parameters_as_bucket_view(config.bucket_view)
                              .stage(stage));
  // DDP with the plain optimizer on every rank: the same gradients, the
  // same per-parameter arithmetic, so ZeRO must match it bit for bit (stage
  // 2 sums the gradients by reduce-scatter, in another order than the
  // allreduce: there, float rounding).
  auto replica_net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel replica(replica_net, options);
  auto replica_optimizer = config.plain(groups_of(*replica_net, config.two_groups));
  if (overlap) {
    zero->overlap_with(model);
    if (overlap->hook) {
      model->register_comm_hook(overlap->hook);
      replica->register_comm_hook(overlap->hook);
    }
  }
  const double tolerance = std::max(config.tolerance, overlap ? overlap->tolerance : 0.0);
  int done = 0;
  for (int steps : {kShortRun, kLongRun}) {
    train_plain(reference_net, *reference, done, steps);
    train_zero(model, *zero, done, steps);
    train_zero(replica, *replica_optimizer, done, steps);
    done = steps;
    report.expect_at_most(ddp_test::max_parameter_difference(*reference_net, *net).value,
                          tolerance, "after " + std::to_string(steps) + " steps");
    const double exact = ddp_test::max_parameter_difference(*replica_net, *net).value;
    if (stage == 1) {
      report.expect(exact == 0, c10::str("after ", steps, " steps, ZeRO differs from DDP with the plain ",
                                         "optimizer by ", exact, ", expected 0"));
    }
    if (stage == 2) {
      // After backward, each rank holds the gradients of its own parameters only.
      size_t wrong = 0;
      for (const auto& p : net->parameters()) {
        wrong += p.grad().defined() != (zero->owner_of(p) == group.rank()) ? 1 : 0;
      }
      report.expect(wrong == 0, c10::str(wrong, " parameters' gradients are defined where this rank ",
                                         "does not own them, or undefined where it does"));
    }
  }
  // Not vacuous: training moved the parameters far beyond the tolerance.
  const double moved =
      ddp_test::max_parameter_difference(*ddp_test::make_closed_form_mlp(), *net).value;
  report.expect(moved > 10 * kTolerance, c10::str("training moved the parameters by only ", moved));
  // The ranks agree exactly: each parameter comes from its owner's broadcast.
  report.expect(ddp_test::max_difference_from_rank0(group, net->parameters()) == 0,
                "the ranks' parameters differ");
  // This rank holds the state of exactly the parameters it owns.
  const auto mine = zero->parameters_of_rank(group.rank());
  report.expect(zero->local_optimizer().state().size() == mine.size(),
                c10::str("the local optimizer holds ", zero->local_optimizer().state().size(),
                         " parameter states, expected ", mine.size()));
  report.note(c10::str("state of ", mine.size(), " of ", net->parameters().size(), " parameters"));
  report.end_case();
}

// The shards: owner_of, parameters_of_rank and partition_parameters agree,
// and every parameter has exactly one owner.
void shards(Report& report, ddp::ProcessGroup& group) {
  report.begin_case("shards");
  auto net = ddp_test::make_closed_form_mlp();
  ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(groups_of(*net, true),
                                                              torch::optim::SGDOptions(0.1));
  std::vector<std::vector<int64_t>> numels;
  for (const auto& g : zero.param_groups()) {
    numels.emplace_back();
    for (const auto& p : g.params()) {
      numels.back().push_back(p.numel());
    }
  }
  const auto owners = ddp::optim::partition_parameters(numels, group.size());
  std::multiset<const void*> owned;
  for (int r = 0; r < group.size(); ++r) {
    for (const auto& p : zero.parameters_of_rank(r)) {
      owned.insert(p.unsafeGetTensorImpl());
      report.expect(zero.owner_of(p) == r, "owner_of disagrees with parameters_of_rank");
    }
  }
  for (size_t g = 0; g < owners.size(); ++g) {
    for (size_t i = 0; i < owners[g].size(); ++i) {
      const auto& p = zero.param_groups()[g].params()[i];
      report.expect(zero.owner_of(p) == owners[g][i], "owner_of disagrees with partition_parameters");
      report.expect(owned.count(p.unsafeGetTensorImpl()) == 1, "a parameter has no single owner");
    }
  }
  report.expect(owned.size() == net->parameters().size(), "not every parameter is owned");
  report.note(c10::str(net->parameters().size(), " parameters over ", group.size(), " rank(s)"));
  report.end_case();
}

// The result every rank agrees on: `ok` on all of them.
bool all_ok(ddp::ProcessGroup& group, bool ok) {
  auto flag = torch::full({1}, ok ? 0 : 1, torch::kInt);
  group.allreduce(flag, {ddp::ReduceOp::kMax})->wait();
  return flag.item<int>() == 0;
}

// ZeRO on W ranks saves (save_checkpoint consolidates), a plain optimizer
// in one process loads and goes on: equal to uninterrupted plain training.
void zero_to_plain(Report& report, ddp::ProcessGroup& group, const std::string& dir) {
  report.begin_case("checkpoint ZeRO on W ranks -> plain Adam");
  const auto config = configs()[0];
  const std::string path = dir + "/zero_to_plain.pt";
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, ddp_options());
  auto zero = config.zero(groups_of(*net, false), {});
  train_zero(model, *zero, 0, kShortRun);
  ddp::save_checkpoint(model, *zero, path);
  bool ok = true;
  if (group.rank() == 0) {
    auto reference_net = ddp_test::make_closed_form_mlp();
    auto reference = config.plain(groups_of(*reference_net, false));
    train_plain(reference_net, *reference, 0, 2 * kShortRun);

    auto resumed_net = ddp_test::make_mlp();
    torch::load(resumed_net, path);
    auto resumed = config.plain(groups_of(*resumed_net, false));
    torch::load(*resumed, path + ".optimizer");
    train_plain(resumed_net, *resumed, kShortRun, 2 * kShortRun);
    const double d = ddp_test::max_parameter_difference(*reference_net, *resumed_net).value;
    report.expect_at_most(d, kTolerance, "resumed plain vs uninterrupted");
    ok = d <= kTolerance;
  }
  report.expect(all_ok(group, ok), "rank 0's resumed plain training differs");
  report.end_case();
}

// Loads the model and optimizer files at `path` into a new model under DDP
// and ZeRO over `group` (nullptr: the default group), trains steps 5 to 10
// and returns the largest difference from `reference`.
double resume_zero(const Config& config, bool two_groups, const std::string& path,
                   const std::shared_ptr<ddp::ProcessGroup>& group, const torch::nn::Module& reference) {
  auto net = ddp_test::make_mlp();
  torch::load(net, path);
  ddp::DistributedDataParallel model(net, ddp_options(group));
  auto zero = config.zero(groups_of(*net, two_groups),
                          ddp::optim::ZeroRedundancyOptimizerOptions().process_group(group));
  torch::load(*zero, path + ".optimizer");
  train_zero(model, *zero, kShortRun, 2 * kShortRun);
  return ddp_test::max_parameter_difference(reference, *net).value;
}

// A plain optimizer saves after 5 steps; ZeRO on W ranks (and on a
// subgroup of W - 1) loads and goes on: equal to uninterrupted training.
void plain_to_zero(Report& report, ddp::ProcessGroup& group, const std::string& dir,
                   const std::shared_ptr<ddp::ProcessGroup>& fewer) {
  for (const bool on_fewer : {false, true}) {
    if (on_fewer && group.size() == 1) {
      continue;
    }
    report.begin_case(on_fewer ? "checkpoint plain AdamW -> ZeRO on W - 1 ranks"
                               : "checkpoint plain AdamW -> ZeRO on W ranks");
    const auto config = configs()[1];
    const std::string path = dir + "/plain_to_zero.pt";
    auto reference_net = ddp_test::make_closed_form_mlp();
    auto reference = config.plain(groups_of(*reference_net, false));
    train_plain(reference_net, *reference, 0, kShortRun);
    if (group.rank() == 0) {
      torch::save(reference_net, path);
      torch::save(*reference, path + ".optimizer");
    }
    group.barrier()->wait();
    train_plain(reference_net, *reference, kShortRun, 2 * kShortRun);
    const bool member = !on_fewer || group.rank() < group.size() - 1;
    if (member) {
      report.expect_at_most(resume_zero(config, false, path, on_fewer ? fewer : nullptr, *reference_net),
                            kTolerance, "resumed ZeRO vs uninterrupted plain");
    } else {
      report.note("not a member of the smaller group");
    }
    group.barrier()->wait();
    report.end_case();
  }
}

// ZeRO on W ranks saves; ZeRO on W - 1 ranks (a subgroup) loads.
void zero_to_fewer(Report& report, ddp::ProcessGroup& group, const std::string& dir,
                   const std::shared_ptr<ddp::ProcessGroup>& fewer) {
  if (group.size() == 1) {
    return;
  }
  report.begin_case("checkpoint ZeRO on W ranks -> ZeRO on W - 1 ranks");
  const auto config = configs()[3]; // two groups
  const std::string path = dir + "/zero_to_fewer.pt";
  auto reference_net = ddp_test::make_closed_form_mlp();
  auto reference = config.plain(groups_of(*reference_net, true));
  train_plain(reference_net, *reference, 0, 2 * kShortRun);
  {
    auto net = ddp_test::make_closed_form_mlp();
    ddp::DistributedDataParallel model(net, ddp_options());
    auto zero = config.zero(groups_of(*net, true), {});
    train_zero(model, *zero, 0, kShortRun);
    ddp::save_checkpoint(model, *zero, path);
  }
  if (group.rank() < group.size() - 1) {
    report.expect_at_most(resume_zero(config, true, path, fewer, *reference_net), kTolerance,
                          "resumed on fewer ranks vs uninterrupted plain");
  }
  group.barrier()->wait();
  report.end_case();
}

// `fn` throws c10::Error whose message contains `expected`.
void expect_error(Report& report, const std::string& expected, const std::function<void()>& fn) {
  try {
    fn();
    report.expect(false, "no error; expected one containing '" + expected + "'");
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    report.expect(message.find(expected) != std::string::npos,
                  "error '" + message + "' does not contain '" + expected + "'");
  }
}

void errors(Report& report, ddp::ProcessGroup& group) {
  const std::string rank = c10::str("[rank ", group.rank(), "/", group.size(), "]");
  report.begin_case("error: save without consolidated state");
  {
    auto net = ddp_test::make_closed_form_mlp();
    ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> zero(net->parameters(),
                                                                 torch::optim::AdamOptions(0.1));
    torch::serialize::OutputArchive archive;
    expect_error(report, rank + " ZeroRedundancyOptimizer::save: this rank holds no consolidated state",
                 [&] { zero.save(archive); });
    zero.consolidate_state_dict(group.size() - 1);
    if (group.rank() == group.size() - 1) {
      zero.save(archive); // the rank it was gathered on
    } else {
      expect_error(report, "holds no consolidated state", [&] { zero.save(archive); });
    }
    expect_error(report, "rank " + std::to_string(group.size()) + " is not in the group",
                 [&] { zero.consolidate_state_dict(group.size()); });
  }
  report.end_case();

  report.begin_case("error: a parameter in two groups");
  {
    auto net = ddp_test::make_closed_form_mlp();
    auto params = net->parameters();
    expect_error(report, "is in parameter group 0 and in group 1", [&] {
      ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(
          std::vector<OptimizerParamGroup>{OptimizerParamGroup({params[0], params[1]}),
                                           OptimizerParamGroup({params[2], params[0]})},
          torch::optim::SGDOptions(0.1));
    });
    ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(
        std::vector<OptimizerParamGroup>{OptimizerParamGroup({params[0], params[1]})},
        torch::optim::SGDOptions(0.1));
    expect_error(report, "is in parameter group 0 and in group 1",
                 [&] { zero.add_param_group(OptimizerParamGroup({params[1]})); });
  }
  report.end_case();

  report.begin_case("error: sparse and mixed-device parameters");
  {
    auto dense = torch::zeros({3}).requires_grad_(true);
    auto sparse = torch::zeros({4, 2}).to_sparse().requires_grad_(true);
    auto meta = torch::zeros({2}, torch::TensorOptions().device(torch::kMeta)).requires_grad_(true);
    expect_error(report, rank + " ZeroRedundancyOptimizer: parameter of shape [4, 2] in group 0 is sparse", [&] {
      ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(std::vector<torch::Tensor>{dense, sparse},
                                                                  torch::optim::SGDOptions(0.1));
    });
    expect_error(report, "is on meta, the first parameter on cpu; every parameter must be on one device", [&] {
      ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(std::vector<torch::Tensor>{dense, meta},
                                                                  torch::optim::SGDOptions(0.1));
    });
  }
  report.end_case();

  if (group.size() > 1) {
    report.begin_case("error: parameters that differ across ranks");
    auto net = ddp_test::make_closed_form_mlp();
    auto params = net->parameters();
    if (group.rank() == 1) {
      params.pop_back();
    }
    expect_error(report, rank + " ZeroRedundancyOptimizer: the parameters differ across ranks", [&] {
      ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> zero(params, torch::optim::AdamOptions(0.1));
    });
    report.end_case();
  }
}

// add_param_group after training started: the earlier groups keep their
// owners, the new group is sharded, training matches the plain optimizer
// given the same group at the same step.
void added_group(Report& report, ddp::ProcessGroup& group) {
  for (const bool through_base : {false, true}) {
    report.begin_case(through_base ? "add_param_group through torch::optim::Optimizer&"
                                   : "add_param_group");
    auto reference_net = ddp_test::make_closed_form_mlp();
    auto all = reference_net->parameters();
    torch::optim::Adam reference(std::vector<torch::Tensor>(all.begin(), all.begin() + 4),
                                 torch::optim::AdamOptions(1e-2));
    auto net = ddp_test::make_closed_form_mlp();
    auto params = net->parameters();
    ddp::DistributedDataParallel model(net, ddp_options());
    ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> zero(
        std::vector<torch::Tensor>(params.begin(), params.begin() + 4), torch::optim::AdamOptions(1e-2));
    std::vector<int> before;
    for (int i = 0; i < 4; ++i) {
      before.push_back(zero.owner_of(params[static_cast<size_t>(i)]));
    }
    train_plain(reference_net, reference, 0, kShortRun);
    train_zero(model, zero, 0, kShortRun);
    reference.add_param_group(
        OptimizerParamGroup(std::vector<torch::Tensor>(all.begin() + 4, all.end())));
    OptimizerParamGroup added(std::vector<torch::Tensor>(params.begin() + 4, params.end()));
    if (through_base) {
      static_cast<torch::optim::Optimizer&>(zero).add_param_group(added);
    } else {
      zero.add_param_group(added);
    }
    train_plain(reference_net, reference, kShortRun, 2 * kShortRun);
    train_zero(model, zero, kShortRun, 2 * kShortRun);
    for (int i = 0; i < 4; ++i) {
      report.expect(zero.owner_of(params[static_cast<size_t>(i)]) == before[static_cast<size_t>(i)],
                    "an earlier parameter changed owner");
    }
    report.expect_at_most(ddp_test::max_parameter_difference(*reference_net, *net).value, kTolerance,
                          "after 10 steps");
    report.expect(zero.local_optimizer().state().size() == zero.parameters_of_rank(group.rank()).size(),
                  "the local optimizer does not hold exactly this rank's states");
    report.end_case();
  }
}

// With overlap, parameters change during backward: counted when the input's
// gradient is computed (the last thing backward does), over all ranks. With
// 4 buckets, the earlier ones are stepped before; with
// find_unused_parameters, every bucket waits for the usage map at the end.
void steps_during_backward(Report& report, ddp::ProcessGroup& group) {
  for (const bool early : {true, false}) {
    report.begin_case(early ? "overlap: buckets stepped during backward"
                            : "overlap: with find_unused_parameters, at backward's end");
    auto net = ddp_test::make_closed_form_mlp();
    ddp::DistributedDataParallel model(
        net, early ? tiny_buckets() : tiny_buckets().find_unused_parameters(true));
    ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(net->parameters(),
                                                                torch::optim::SGDOptions(0.1));
    zero.overlap_with(model);
    std::vector<torch::Tensor> before;
    for (const auto& p : net->parameters()) {
      before.push_back(p.detach().clone());
    }
    int64_t changed = -1;
    auto [x, y] = ddp_test::rank_batch(0, group.rank(), group.size());
    x.requires_grad_(true);
    x.register_hook([&](const torch::Tensor& grad) {
      changed = 0;
      const auto params = net->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        changed += torch::equal(params[i].detach(), before[i]) ? 0 : 1;
      }
      return grad;
    });
    zero.zero_grad();
    mse(model->forward(x), y).backward();
    auto most = torch::full({1}, changed, torch::kLong);
    group.allreduce(most, {ddp::ReduceOp::kMax})->wait();
    zero.step();
    const int64_t seen = most.item<int64_t>();
    if (early) {
      report.expect(seen > 0, "no parameter had changed before the input's gradient was computed");
    } else {
      report.expect(seen == 0, c10::str(seen, " parameters changed before the usage map was reduced"));
    }
    report.note(c10::str(seen, " parameter(s) updated before backward reached the input"));
    report.end_case();
  }
}

// A stage-2 optimizer destroyed before its model: the model's backward goes
// on as plain DDP (every gradient reduced and written back).
void stage2_outlived(Report& report, ddp::ProcessGroup& group) {
  report.begin_case("stage 2: the model outlives the optimizer");
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, tiny_buckets());
  {
    ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(
        net->parameters(), torch::optim::SGDOptions(0.1), ddp::optim::ZeroRedundancyOptimizerOptions().stage(2));
    zero.overlap_with(model);
    train_zero(model, zero, 0, 2);
  }
  torch::optim::SGD plain(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [x, y] = ddp_test::rank_batch(2, group.rank(), group.size());
  plain.zero_grad();
  mse(model->forward(x), y).backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) {
    report.expect(p.grad().defined(), "a gradient is undefined after the optimizer is gone");
    grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  }
  report.expect(ddp_test::max_difference_from_rank0(group, grads) == 0,
                "the ranks' gradients differ after the optimizer is gone");
  report.end_case();
}

// overlap_with refuses a model over other parameters; Join refuses an
// overlapped model.
void overlap_errors(Report& report) {
  report.begin_case("error: overlap_with a model over other parameters, and Join");
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, ddp_options());
  auto params = net->parameters();
  ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> part(
      std::vector<torch::Tensor>(params.begin(), params.begin() + 4), torch::optim::AdamOptions(0.1));
  expect_error(report, "the model has 8 parameters and the optimizer 4, of which 4 are the same tensors",
               [&] { part.overlap_with(model); });
  ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> zero(params, torch::optim::AdamOptions(0.1));
  zero.overlap_with(model);
  expect_error(report, "ddp::Join: this DistributedDataParallel runs a ZeroRedundancyOptimizer's steps",
               [&] { ddp::Join join(model); });
  ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> stage2(
      params, torch::optim::AdamOptions(0.1), ddp::optim::ZeroRedundancyOptimizerOptions().stage(2));
  expect_error(report, "stage 2 reduce-scatters the model's gradients: call overlap_with(model)",
               [&] { stage2.step(); });
  expect_error(report, "stage must be 1 or 2 (got 3)", [&] {
    ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> bad(
        params, torch::optim::AdamOptions(0.1), ddp::optim::ZeroRedundancyOptimizerOptions().stage(3));
  });
  report.end_case();
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: zero_main <scratch directory>\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    Report report("zero_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    std::vector<int> fewer_ranks;
    for (int r = 0; r + 1 < std::max(group->size(), 2); ++r) {
      fewer_ranks.push_back(r);
    }
    auto fewer = group->size() > 1 ? ddp::new_group(fewer_ranks) : nullptr;
    const std::string dir = ddp_test::run_directory(argv[1], "zero_main", *group);
    for (const auto& config : configs()) {
      parity(report, *group, config);
      parity(report, *group, config, Overlap{"4 buckets", tiny_buckets()});
    }
    const auto adam = configs()[0];
    // One bucket, stepped in backward's final callback.
    parity(report, *group, adam, Overlap{"one bucket", ddp_options()});
    // The usage map is reduced after the last bucket: every bucket is
    // stepped in the final callback.
    parity(report, *group, adam,
           Overlap{"find_unused_parameters", tiny_buckets().find_unused_parameters(true)});
    // The first iteration records, the later ones step during backward.
    parity(report, *group, configs()[2], Overlap{"static_graph", tiny_buckets().static_graph(true)});
    // Any hook: compressed to bfloat16 (8 bits of mantissa), so only the
    // exact comparison with DDP under the same hook is tight.
    parity(report, *group, adam,
           Overlap{"bf16_compress", tiny_buckets(), ddp::comm_hooks::bf16_compress(), 5e-2});
    steps_during_backward(report, *group);
    // Stage 2: gradients reduce-scattered to their owners.
    for (const auto& config : {configs()[0], configs()[2], configs()[4]}) {
      Overlap stage2{"stage 2, 4 buckets", tiny_buckets()};
      stage2.stage = 2;
      parity(report, *group, config, stage2);
    }
    Overlap stage2_one{"stage 2, one bucket", ddp_options()};
    stage2_one.stage = 2;
    parity(report, *group, adam, stage2_one);
    Overlap stage2_unused{"stage 2, find_unused_parameters", tiny_buckets().find_unused_parameters(true)};
    stage2_unused.stage = 2;
    parity(report, *group, adam, stage2_unused);
    // The buckets are released between backward passes and laid out by
    // owner (Note [Released buckets]): gradients that were bucket views, and
    // a static graph whose buckets are rebuilt after its first iteration.
    Overlap stage2_views{"stage 2, gradient_as_bucket_view", ddp_options().gradient_as_bucket_view(true)};
    stage2_views.stage = 2;
    parity(report, *group, adam, stage2_views);
    Overlap stage2_static{"stage 2, static_graph", tiny_buckets().static_graph(true)};
    stage2_static.stage = 2;
    parity(report, *group, configs()[2], stage2_static);
    stage2_outlived(report, *group);
    overlap_errors(report);
    shards(report, *group);
    added_group(report, *group);
    zero_to_plain(report, *group, dir);
    plain_to_zero(report, *group, dir, fewer);
    zero_to_fewer(report, *group, dir, fewer);
    errors(report, *group);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_main: %s\n", e.what());
    return 1;
  }
}
