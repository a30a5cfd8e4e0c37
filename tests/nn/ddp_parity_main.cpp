// DistributedDataParallel against one process: W ranks that each train on
// their slice of a global batch must end with the parameters that one
// process gets on the whole batch. Also no_sync, the communication hooks,
// broadcast_buffers, the broadcast at construction, and the bucket layout
// and overlap figures.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_parity_main
// prints one line per case on each rank, e.g.
//   [rank 1]: [ok] parity MLP buckets=tiny view=on: 4 buckets,
//             max |ours - reference| (at 4.bias) 1.49e-08 (tolerance 1e-05)
// (on one line)
// and a summary; exits 1 if a case failed. Run alone (no launcher) it is a
// world of size 1 and checks the same against plain training.
//
// Every rank also trains the single-process reference itself, on the whole
// global batch, from the same closed-form weights (tests/nn/closed_form.h):
// no files are exchanged.

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"
#include "nn/static_graph_models.h"

namespace {

using ddp_test::BranchNet;
using ddp_test::Report;

constexpr int kSteps = 5;
constexpr double kLearningRate = 0.2;
// Float32 sums in a different order: far below what 5 steps move a weight.
constexpr double kTolerance = 1e-5;

// Bucket capacities of the sweep. 0.0001 MiB is 104 bytes: a bias and the
// next weight share a bucket, and the MLP has 4 of them.
struct BucketSize {
  const char* name;
  double first_bucket_cap_mb;
  double bucket_cap_mb;
};
constexpr BucketSize kTiny{"tiny", 0.0001, 0.0001};
constexpr BucketSize kDefault{"default", 1.0, 25.0};
constexpr BucketSize kHuge{"huge", 1000.0, 1000.0};

ddp::DistributedDataParallelOptions options_for(const BucketSize& size) {
  return ddp::DistributedDataParallelOptions()
      .first_bucket_cap_mb(size.first_bucket_cap_mb)
      .bucket_cap_mb(size.bucket_cap_mb);
}

std::string on_off(bool value) {
  return value ? "on" : "off";
}

// The MLP's layers registered in the reverse of the order forward uses them:
// reverse parameter order is then the opposite of the order gradients become
// ready, so that the buckets rebuilt after the first iteration differ from
// the initial ones.
struct ReorderedNetImpl : torch::nn::Module {
  ReorderedNetImpl()
      : head(register_module("head", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))),
        body(register_module("body", torch::nn::Linear(ddp_test::kHidden, ddp_test::kHidden))),
        stem(register_module("stem", torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden))) {}

  torch::Tensor forward(torch::Tensor x) {
    return head(torch::tanh(body(torch::relu(stem(x)))));
  }

  torch::nn::Linear head, body, stem;
};
TORCH_MODULE(ReorderedNet);

// Linear, BatchNorm1d, Linear; forward records the BatchNorm's running
// statistics as they are when forward starts, i.e. after DDP's broadcast.
struct ProbeBnNetImpl : torch::nn::Module {
  ProbeBnNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden))),
        bn(register_module("bn", torch::nn::BatchNorm1d(ddp_test::kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))) {}

  torch::Tensor forward(torch::Tensor x) {
    running_mean_at_entry = bn->running_mean.clone();
    running_var_at_entry = bn->running_var.clone();
    return fc2(torch::relu(bn(fc1(x))));
  }

  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
  torch::Tensor running_mean_at_entry;
  torch::Tensor running_var_at_entry;
};
TORCH_MODULE(ProbeBnNet);

std::vector<std::string> parameter_names(const torch::nn::Module& module) {
  return module.named_parameters().keys();
}

std::vector<std::string> flatten_names(const std::vector<ddp::BucketInsight>& buckets) {
  std::vector<std::string> names;
  for (const auto& bucket : buckets) {
    names.insert(names.end(), bucket.parameter_names.begin(), bucket.parameter_names.end());
  }
  return names;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) {
    text += (text.empty() ? "" : " ") + name;
  }
  return "[" + text + "]";
}

// Whether `buckets` hold every one of `expected` exactly once (in any order).
bool covers_each_once(const std::vector<ddp::BucketInsight>& buckets,
                      std::vector<std::string> expected) {
  auto names = flatten_names(buckets);
  std::sort(names.begin(), names.end());
  std::sort(expected.begin(), expected.end());
  return names == expected;
}

// Trains `reference` on whole global batches and `model` on this rank's
// slices, kSteps steps of SGD each.
template <typename Net>
void train_both(Net reference, ddp::DistributedDataParallel& model,
                const std::function<void(int step)>& after_step = nullptr) {
  const auto& group = *model->process_group();
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(kLearningRate));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    reference_optimizer.step();

    auto [xs, ys] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    torch::mse_loss(model(xs), ys).backward();
    optimizer.step();
    if (after_step) {
      after_step(step);
    }
  }
}

// Checks `net` (trained through DDP) against `reference` to `tolerance`, and
// that training moved the weights well beyond it (else the check proves
// nothing). Five steps move the largest weight by about 0.036.
void expect_parity(Report& report, const torch::nn::Module& net, const torch::nn::Module& reference,
                   const torch::nn::Module& initial, double tolerance) {
  const auto difference = ddp_test::max_parameter_difference(net, reference);
  report.expect_at_most(difference.value, tolerance,
                        "max |ours - reference| (at " + difference.where + ")");
  const auto moved = ddp_test::max_parameter_difference(reference, initial);
  report.expect(moved.value > 10 * tolerance,
                "training barely moved the weights (" + std::to_string(moved.value) +
                    "): the parity check is too weak");
}

// ---- The parity sweep: bucket sizes x gradient_as_bucket_view x find_unused_parameters

void parity_mlp(Report& report, const BucketSize& size, bool as_view) {
  report.begin_case(std::string("parity MLP buckets=") + size.name + " view=" + on_off(as_view));
  auto reference = ddp_test::make_closed_form_mlp();
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, options_for(size).gradient_as_bucket_view(as_view));
  report.expect(model->parameters().size() == net->parameters().size(),
                "model->parameters() does not list the wrapped module's parameters");
  train_both(reference, model);
  report.note(std::to_string(model->last_iteration_insight().buckets.size()) + " buckets");
  expect_parity(report, *net, *reference, *ddp_test::make_closed_form_mlp(), kTolerance);
  // With gradient_as_bucket_view the gradients of a bucket share its
  // storage; without, each gradient has its own.
  auto parameters = net->named_parameters();
  for (const auto& bucket : model->bucket_layout()) {
    const auto& names = bucket.parameter_names;
    for (size_t k = 1; k < names.size(); ++k) {
      const bool shared = parameters[names[k]].grad().is_alias_of(parameters[names[0]].grad());
      report.expect(shared == as_view, names[k] + "'s gradient " +
                                           (shared ? "shares" : "does not share") +
                                           " storage with " + names[0] + "'s, in the same bucket");
    }
  }
#ifdef DDP_WITH_MPI
  // Under MPI with DDP_MPI_SHARED_MEMORY_MIN_BYTES=0 every bucket is in
  // memory that the ranks share (Note [Shared buffers]); the gradients
  // are views of the buckets here.
  const char* min_bytes = std::getenv("DDP_MPI_SHARED_MEMORY_MIN_BYTES");
  auto* mpi = dynamic_cast<ddp::ProcessGroupMPI*>(ddp::default_process_group().get());
  if (as_view && mpi != nullptr && mpi->size() > 1 && min_bytes != nullptr &&
      std::string(min_bytes) == "0") {
    for (const auto& p : net->named_parameters()) {
      report.expect(mpi->is_shared_buffer(p.value().grad()),
                    p.key() + "'s gradient is not in a bucket in shared memory");
    }
  }
#endif
  report.end_case();
}

void parity_unused(Report& report, const BucketSize& size, bool as_view) {
  report.begin_case(std::string("parity unused layer (find_unused_parameters) buckets=") +
                    size.name + " view=" + on_off(as_view));
  BranchNet initial;
  ddp_test::init_closed_form(*initial);
  BranchNet reference;
  ddp_test::init_closed_form(*reference);
  BranchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(
      net, options_for(size).gradient_as_bucket_view(as_view).find_unused_parameters(true));
  train_both(reference, model);
  expect_parity(report, *net, *reference, *initial, kTolerance);
  for (const auto& p : net->extra->named_parameters()) {
    report.expect(torch::equal(p.value(), initial->extra->named_parameters()[p.key()]),
                  "the unused extra." + p.key() + " changed");
    report.expect(!p.value().grad().defined(),
                  "the unused extra." + p.key() + " has a gradient; it should stay undefined");
  }
  report.end_case();
}

// ---- no_sync: k local micro-steps, then a synchronised one

void no_sync_accumulation(Report& report, const BucketSize& size, bool as_view) {
  constexpr int kMicroSteps = 3; // 2 under no_sync, then 1 synchronised
  constexpr int kOuterSteps = 2;
  report.begin_case(std::string("no_sync ") + std::to_string(kMicroSteps - 1) +
                    " micro-steps then a synced one, buckets=" + size.name + " view=" +
                    on_off(as_view));
  auto group = ddp::default_process_group();
  auto reference = ddp_test::make_closed_form_mlp();
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, options_for(size).gradient_as_bucket_view(as_view));
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(kLearningRate));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int outer = 0; outer < kOuterSteps; ++outer) {
    reference_optimizer.zero_grad();
    optimizer.zero_grad();
    for (int micro = 0; micro < kMicroSteps; ++micro) {
      const int batch = outer * kMicroSteps + micro;
      auto [x, y] = ddp_test::global_batch(batch);
      torch::mse_loss(reference->forward(x), y).backward();
      auto [xs, ys] = ddp_test::rank_batch(batch, group->rank(), group->size());
      if (micro + 1 < kMicroSteps) {
        auto guard = model->no_sync();
        torch::mse_loss(model(xs), ys).backward();
      } else {
        torch::mse_loss(model(xs), ys).backward();
      }
      if (outer == 0 && micro == 0 && group->size() > 1) {
        // Local gradients of different slices: no communication happened.
        std::vector<torch::Tensor> grads;
        for (const auto& p : net->parameters()) {
          grads.push_back(p.grad());
        }
        report.expect(ddp_test::max_difference_from_rank0(*group, grads) > 0,
                      "gradients agree across ranks after a no_sync backward: were they reduced?");
      }
    }
    // The synchronised backward reduced the sum of the micro-steps.
    double grad_difference = 0;
    auto reference_parameters = reference->named_parameters();
    for (const auto& p : net->named_parameters()) {
      grad_difference = std::max(
          grad_difference,
          (p.value().grad() - reference_parameters[p.key()].grad()).abs().max().item<double>());
    }
    report.expect_at_most(grad_difference, kTolerance,
                          "outer step " + std::to_string(outer) + " max |grad - reference grad|");
    reference_optimizer.step();
    optimizer.step();
  }
  expect_parity(report, *net, *reference, *ddp_test::make_closed_form_mlp(), kTolerance);
  report.end_case();
}

// ---- Communication hooks

// `rounds`: the hook rounds gradients to a narrower type, so that on several
// ranks the result must differ from exact float32 reduction (which agrees
// to about 1e-8 here): else the hook did not compress.
void compress_hook(Report& report, const std::string& name, ddp::CommHook hook,
                   double tolerance, bool rounds) {
  report.begin_case("comm hook " + name + " buckets=tiny");
  auto reference = ddp_test::make_closed_form_mlp();
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, options_for(kTiny));
  model->register_comm_hook(std::move(hook));
  train_both(reference, model);
  expect_parity(report, *net, *reference, *ddp_test::make_closed_form_mlp(), tolerance);
  if (rounds && model->process_group()->size() > 1) {
    const double difference = ddp_test::max_parameter_difference(*net, *reference).value;
    report.expect(difference > 1e-6, "the result is as exact as float32 (difference " +
                                         std::to_string(difference) +
                                         "): were the gradients compressed?");
  }
  report.end_case();
}

// What a custom hook saw in one call.
struct HookCall {
  size_t index;
  bool is_last;
  std::vector<std::string> names;
  int64_t numel;
};

void custom_hook(Report& report) {
  report.begin_case("comm hook custom (allreduce, then divide) buckets=tiny");
  auto reference = ddp_test::make_closed_form_mlp();
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, options_for(kTiny));

  // The hook runs on the autograd engine thread.
  auto mutex = std::make_shared<std::mutex>();
  auto calls = std::make_shared<std::vector<HookCall>>();
  model->register_comm_hook([mutex, calls](ddp::ProcessGroup& group, ddp::GradBucket& bucket) {
    {
      std::lock_guard<std::mutex> lock(*mutex);
      calls->push_back(
          {bucket.index(), bucket.is_last(), bucket.parameter_names(), bucket.buffer().numel()});
    }
    const at::Tensor buffer = bucket.buffer();
    const double world_size = group.size();
    return group.allreduce(buffer)->then([buffer, world_size](const std::vector<at::Tensor>&) {
      buffer.div_(world_size);
      return std::vector<at::Tensor>{buffer};
    });
  });

  size_t total_calls = 0;
  train_both(reference, model, [&](int step) {
    // The insight first: the Reducer calls the hook under its own lock, so
    // taking the two locks in the other order here would invert the order.
    const auto insight = model->last_iteration_insight();
    std::lock_guard<std::mutex> lock(*mutex);
    const std::string at_step = " at step " + std::to_string(step);
    report.expect(insight.buckets.size() > 1,
                  "expected several buckets with tiny caps, got " +
                      std::to_string(insight.buckets.size()) + at_step);
    report.expect(calls->size() == insight.buckets.size(),
                  "the hook ran " + std::to_string(calls->size()) + " times for " +
                      std::to_string(insight.buckets.size()) + " buckets" + at_step);
    std::set<size_t> seen;
    for (const auto& call : *calls) {
      report.expect(seen.insert(call.index).second,
                    "the hook ran twice for bucket " + std::to_string(call.index) + at_step);
      if (call.index >= insight.buckets.size()) {
        report.expect(false, "the hook got bucket index " + std::to_string(call.index) + at_step);
        continue;
      }
      const auto& bucket = insight.buckets[call.index];
      report.expect(call.is_last == (call.index + 1 == insight.buckets.size()),
                    "is_last() is wrong for bucket " + std::to_string(call.index) + at_step);
      report.expect(call.names == bucket.parameter_names,
                    "bucket " + std::to_string(call.index) + " holds " + join_names(call.names) +
                        " in the hook but " + join_names(bucket.parameter_names) +
                        " in last_iteration_insight()" + at_step);
      int64_t numel = 0;
      for (const auto& name : call.names) {
        numel += net->named_parameters()[name].numel();
      }
      report.expect(call.numel == numel, "bucket " + std::to_string(call.index) + "'s buffer has " +
                                             std::to_string(call.numel) + " elements, its " +
                                             "parameters " + std::to_string(numel) + at_step);
    }
    total_calls += calls->size();
    calls->clear();
  });
  report.note(std::to_string(total_calls) + " hook calls in " + std::to_string(kSteps) + " steps");
  expect_parity(report, *net, *reference, *ddp_test::make_closed_form_mlp(), kTolerance);
  report.end_case();
}

// ---- broadcast_buffers and the broadcast at construction

void broadcast_buffers(Report& report, bool broadcast) {
  report.begin_case("broadcast_buffers=" + on_off(broadcast) + " (BatchNorm1d running stats)");
  auto group = ddp::default_process_group();
  const int rank = group->rank();
  ProbeBnNet net;
  ddp_test::init_closed_form(*net);
  {
    torch::NoGradGuard no_grad;
    net->bn->running_mean.fill_(static_cast<double>(rank));
    net->bn->running_var.fill_(1.0 + rank);
  }
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions().broadcast_buffers(
                                              broadcast));
  report.expect(ddp_test::max_difference_from_rank0(*group, net->buffers()) == 0,
                "buffers differ across ranks after construction, which broadcasts rank 0's");
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  std::string differences;
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, rank, group->size());
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model(x), y);
    // Each rank's forward updated its statistics with its own slice; with
    // broadcast_buffers the next forward must start from rank 0's.
    const double entry_difference = ddp_test::max_difference_from_rank0(
        *group, {net->running_mean_at_entry, net->running_var_at_entry});
    const std::string at_step = " at the start of forward " + std::to_string(step);
    differences += (differences.empty() ? "" : " ") + std::to_string(entry_difference);
    if (broadcast || step == 0) {
      report.expect(entry_difference == 0,
                    "running statistics differ from rank 0's by " +
                        std::to_string(entry_difference) + at_step);
    } else if (group->size() > 1) {
      report.expect(entry_difference > 0,
                    "running statistics equal rank 0's" + at_step +
                        " without broadcast_buffers: the check cannot tell");
    }
    loss.backward();
    optimizer.step();
  }
  report.note("difference from rank 0's statistics at the start of each forward: " +
              differences);
  report.end_case();
}

void construction_broadcast(Report& report) {
  report.begin_case("construction broadcasts rank 0's parameters (not with init_sync(false), nor ignored ones)");
  auto group = ddp::default_process_group();
  torch::manual_seed(1000 + group->rank()); // a different random init on every rank
  auto net = ddp_test::make_mlp();
  const double before = ddp_test::max_difference_from_rank0(*group, net->parameters());
  if (group->size() > 1) {
    report.expect(before > 0, "the ranks' random inits agree: the check cannot tell");
  }
  ddp::DistributedDataParallel model(net);
  const double after = ddp_test::max_difference_from_rank0(*group, net->parameters());
  report.expect(after == 0, "parameters differ from rank 0's by " + std::to_string(after) +
                                " after construction");
  report.expect(model->max_parameter_difference_across_ranks() == 0,
                "max_parameter_difference_across_ranks() is not 0 after construction");
  report.note("difference before " + std::to_string(before) + ", after " + std::to_string(after));

  // init_sync(false): nothing is broadcast, each rank keeps its own values.
  auto own = ddp_test::make_mlp();
  const double own_before = ddp_test::max_difference_from_rank0(*group, own->parameters());
  ddp::DistributedDataParallel unsynced(own, ddp::DistributedDataParallelOptions().init_sync(false));
  report.expect(ddp_test::max_difference_from_rank0(*group, own->parameters()) == own_before,
                "init_sync(false) changed the parameters");

  // params_and_buffers_to_ignore: the first Linear is neither broadcast nor
  // reduced; the rest is both.
  auto partly = ddp_test::make_mlp();
  const auto first = partly->named_parameters()["0.weight"].clone();
  ddp::DistributedDataParallel ignoring(
      partly, ddp::DistributedDataParallelOptions().params_and_buffers_to_ignore({"0.weight", "0.bias"}));
  report.expect(torch::equal(partly->named_parameters()["0.weight"], first),
                "an ignored parameter was broadcast at construction");
  auto [x, y] = ddp_test::rank_batch(0, group->rank(), group->size());
  torch::mse_loss(ignoring(x), y).backward();
  std::vector<at::Tensor> ignored_grads = {partly->named_parameters()["0.weight"].grad()};
  std::vector<at::Tensor> reduced_grads = {partly->named_parameters()["2.weight"].grad()};
  if (group->size() > 1) {
    report.expect(ddp_test::max_difference_from_rank0(*group, ignored_grads) > 0,
                  "an ignored parameter's gradient was reduced");
  }
  report.expect(ddp_test::max_difference_from_rank0(*group, reduced_grads) == 0,
                "a parameter not ignored has another gradient than rank 0's");
  report.expect(ignoring->max_parameter_difference_across_ranks() == 0,
                "max_parameter_difference_across_ranks counts the ignored parameters");
  try {
    ddp::DistributedDataParallel wrong(ddp_test::make_mlp(),
                                       ddp::DistributedDataParallelOptions().params_and_buffers_to_ignore({"9.weight"}));
    report.expect(false, "an unknown name in params_and_buffers_to_ignore was accepted");
  } catch (const c10::Error& e) {
    report.expect(std::string(e.what()).find("params_and_buffers_to_ignore names '9.weight'") != std::string::npos,
                  std::string("unclear error: ") + e.what());
  }
  report.end_case();
}

// ---- Bucket layout and overlap

void layout_and_overlap(Report& report) {
  report.begin_case("bucket layout and overlap, MLP buckets=tiny");
  auto reference = ddp_test::make_closed_form_mlp();
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net, options_for(kTiny));
  auto names = parameter_names(*net);
  const auto reversed = std::vector<std::string>(names.rbegin(), names.rend());

  const auto initial = model->bucket_layout();
  report.expect(initial.size() > 1, "expected several buckets with tiny caps, got " +
                                        std::to_string(initial.size()));
  report.expect(flatten_names(initial) == reversed,
                "the initial layout " + join_names(flatten_names(initial)) +
                    " is not the reverse parameter order " + join_names(reversed));
  train_both(reference, model, [&](int step) {
    const auto insight = model->last_iteration_insight();
    const std::string at_step = " at step " + std::to_string(step);
    report.expect(insight.iteration == step + 1, "iteration is " +
                                                     std::to_string(insight.iteration) + at_step);
    report.expect(insight.buckets.size() > 1, "expected several buckets, got " +
                                                  std::to_string(insight.buckets.size()) + at_step);
    report.expect(insight.first_bucket_started_before_backward_end,
                  "the first bucket did not start before the end of backward" + at_step);
    report.expect(covers_each_once(insight.buckets, names),
                  "the iteration's buckets " + join_names(flatten_names(insight.buckets)) +
                      " do not hold every parameter once" + at_step);
    report.expect(insight.overlap_fraction >= 0 && insight.overlap_fraction <= 1,
                  "overlap_fraction " + std::to_string(insight.overlap_fraction) +
                      " is outside [0, 1]" + at_step);
    // The timer's events: forward start and end, first and last gradient.
    report.expect(insight.forward_ms > 0 && insight.backward_compute_ms > 0,
                  "forward_ms " + std::to_string(insight.forward_ms) + " and backward_compute_ms " +
                      std::to_string(insight.backward_compute_ms) + " should be positive" +
                      at_step);
    for (const auto& bucket : insight.buckets) {
      report.expect(bucket.launch_ms <= bucket.done_ms,
                    "bucket " + std::to_string(bucket.index) + " is done before it started" +
                        at_step);
    }
  });
  const auto later = model->bucket_layout();
  report.expect(covers_each_once(later, names), "the layout after training " +
                                                    join_names(flatten_names(later)) +
                                                    " does not hold every parameter once");
  const auto insight = model->last_iteration_insight();
  report.note(std::to_string(insight.buckets.size()) + " buckets, overlap " +
              std::to_string(insight.overlap_fraction));
  expect_parity(report, *net, *reference, *ddp_test::make_closed_form_mlp(), kTolerance);
  report.end_case();
}

void rebuilt_layout(Report& report) {
  report.begin_case("bucket layout rebuilt after the first iteration, layers registered backwards");
  ReorderedNet initial;
  ddp_test::init_closed_form(*initial);
  ReorderedNet reference;
  ddp_test::init_closed_form(*reference);
  ReorderedNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options_for(kTiny));
  auto names = parameter_names(*net);
  const auto reversed = std::vector<std::string>(names.rbegin(), names.rend());

  const auto first = model->bucket_layout();
  report.expect(flatten_names(first) == reversed,
                "the initial layout " + join_names(flatten_names(first)) +
                    " is not the reverse parameter order " + join_names(reversed));
  train_both(reference, model);
  const auto later = model->bucket_layout();
  report.expect(covers_each_once(later, names), "the rebuilt layout " +
                                                    join_names(flatten_names(later)) +
                                                    " does not hold every parameter once");
  // As PyTorch's: rebuilt in the order gradients became ready, `head`'s first.
  report.expect(!later.empty() && !later.front().parameter_names.empty() &&
                    later.front().parameter_names.front().rfind("head.", 0) == 0,
                "the rebuilt layout " + join_names(flatten_names(later)) +
                    " does not start with head's parameters, whose gradients are ready first");
  report.expect(model->last_iteration_insight().first_bucket_started_before_backward_end,
                "after the rebuild, the first bucket did not start before the end of backward");
  report.note("layout " + join_names(flatten_names(first)) + " became " +
              join_names(flatten_names(later)));
  expect_parity(report, *net, *reference, *initial, kTolerance);
  report.end_case();
}

// ---- static_graph: hooks counted in the first iteration, reduced after it

// TwiceNet: `shared` runs twice per forward, under reentrant checkpoints
// (its hooks fire twice per backward) or without (once).
void parity_static_twice(Report& report, const BucketSize& size, bool as_view, bool checkpointed) {
  report.begin_case(std::string("parity static_graph layer run twice") +
                    (checkpointed ? " under checkpoints" : "") + " buckets=" + size.name +
                    " view=" + on_off(as_view));
  ddp_test::TwiceNet initial(checkpointed);
  ddp_test::init_closed_form(*initial);
  ddp_test::TwiceNet reference(checkpointed);
  ddp_test::init_closed_form(*reference);
  ddp_test::TwiceNet net(checkpointed);
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(
      net, options_for(size).gradient_as_bucket_view(as_view).static_graph(true));
  train_both(reference, model);
  expect_parity(report, *net, *reference, *initial, kTolerance);
  const auto layout = model->bucket_layout();
  report.expect(covers_each_once(layout, parameter_names(*net)),
                "the rebuilt layout " + join_names(flatten_names(layout)) +
                    " does not hold every parameter once");
  report.note(std::to_string(layout.size()) + " buckets: " + join_names(flatten_names(layout)));
  report.end_case();
}

// BranchNet's `extra`, never used: found unused in the first iteration and
// marked ready without a graph walk after it; its gradient stays undefined.
void parity_static_unused(Report& report, const BucketSize& size, bool as_view) {
  report.begin_case(std::string("parity static_graph unused layer buckets=") + size.name +
                    " view=" + on_off(as_view));
  BranchNet initial;
  ddp_test::init_closed_form(*initial);
  BranchNet reference;
  ddp_test::init_closed_form(*reference);
  BranchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(
      net, options_for(size).gradient_as_bucket_view(as_view).static_graph(true));
  train_both(reference, model);
  expect_parity(report, *net, *reference, *initial, kTolerance);
  for (const auto& p : net->extra->named_parameters()) {
    report.expect(torch::equal(p.value(), initial->extra->named_parameters()[p.key()]),
                  "the unused extra." + p.key() + " changed");
    report.expect(!p.value().grad().defined(),
                  "the unused extra." + p.key() + " has a gradient; it should stay undefined");
  }
  // Rebuilt after the first iteration: the unused layer's bucket first,
  // since it is ready at the first hook.
  const auto layout = model->bucket_layout();
  report.expect(!layout.empty() && !layout.front().parameter_names.empty() &&
                    layout.front().parameter_names.front().rfind("extra.", 0) == 0,
                "the rebuilt layout " + join_names(flatten_names(layout)) +
                    " does not start with the unused extra's parameters");
  report.end_case();
}

} // namespace

int main() {
  try {
    auto group = ddp::init_process_group();
    Report report("ddp_parity_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");

    for (const BucketSize& size : {kTiny, kDefault, kHuge}) {
      for (bool as_view : {false, true}) {
        parity_mlp(report, size, as_view);
        parity_unused(report, size, as_view);
      }
    }
    no_sync_accumulation(report, kDefault, false);
    no_sync_accumulation(report, kTiny, true);
    // float16 keeps 11 significant bits, bfloat16 8: a relative error of
    // about 2^-11 or 2^-8 per gradient, more on 3 ranks where the sums are
    // rounded too. A step moves a weight by at most about 0.007 here, so 5
    // steps err by a few 1e-5 and 1e-4 (4.6e-5 and 1.8e-4 seen on 3 ranks).
    compress_hook(report, "fp16_compress", ddp::comm_hooks::fp16_compress(), 2e-4, true);
    compress_hook(report, "bf16_compress", ddp::comm_hooks::bf16_compress(), 2e-3, true);
    compress_hook(report, "allreduce (the default, registered explicitly)",
                  ddp::comm_hooks::allreduce(), kTolerance, false);
    custom_hook(report);
    broadcast_buffers(report, true);
    broadcast_buffers(report, false);
    construction_broadcast(report);
    layout_and_overlap(report);
    rebuilt_layout(report);
    parity_static_twice(report, kTiny, false, true);
    parity_static_twice(report, kDefault, true, true);
    parity_static_twice(report, kDefault, false, false);
    parity_static_unused(report, kTiny, true);
    parity_static_unused(report, kHuge, false);

    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_parity_main: %s\n", e.what());
    return 1;
  }
}
