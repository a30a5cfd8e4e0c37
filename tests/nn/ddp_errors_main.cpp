// DistributedDataParallel's errors under real processes: each must be a
// c10::Error on every rank, with a message that says what is wrong, and no
// rank may hang.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main models-differ
//     Rank 1's first layer is 17 wide instead of 16: construction must fail
//     on every rank, naming '0.weight' and both shapes.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main unused-parameter
//     A layer that forward never uses, without find_unused_parameters: the
//     backward leaves the reduction unfinished, and the next forward must fail
//     naming that layer's parameters.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main join-disagree
//     Under ddp::Join, rank 0 runs a step under no_sync() and the others do
//     not: the forward must fail on every rank, saying that the ranks still
//     training disagree on reducing gradients.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main join-throw
//     ddp::Join with throw_on_early_termination, rank 0 with one batch and
//     the others with three: rank 0's finish() and the others' second
//     forward must all throw, and the group must stay usable.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main static-graph-changed
//     With static_graph, a layer unused in the first iteration is used in the
//     second: that backward must fail naming the layer; then a layer used in
//     the first iteration goes unused in the second: the next forward must
//     fail naming it with its gradient counts. Each with one bucket and with
//     one per layer.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main static-graph-changed-one-rank
//     As the first case of static-graph-changed, on rank 0 only: rank 0's
//     backward must fail at once; the other ranks, waiting for collectives
//     that rank 0 never issues, must fail too (a communication error) within
//     the group's timeout, set to 10 s here, instead of hanging.
//   build/ddprun --nproc-per-node 2 build/tests/ddp_errors_main reused-parameter
//     Without static_graph, a layer run twice under reentrant checkpoints
//     (its hook fires twice in one backward): the backward must fail naming
//     the layer and suggesting static_graph, as PyTorch's does.
// Each rank prints "expected error: ..." and exits 0, or says what went wrong
// and exits 1.

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/static_graph_models.h"

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// The first line of an error (c10::Error appends a C++ backtrace).
std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// 0 if `message` contains every one of `needles` (case-insensitive), else 1
// with the missing ones named.
int expect_message(const std::string& message, const std::vector<std::string>& needles) {
  int status = 0;
  for (const auto& needle : needles) {
    if (lower(message).find(lower(needle)) == std::string::npos) {
      std::printf("FAILED: the error does not mention '%s': %s\n", needle.c_str(),
                  message.c_str());
      status = 1;
    }
  }
  if (status == 0) {
    std::printf("expected error: %s\n", first_line(message).c_str());
  }
  return status;
}

int models_differ(ddp::ProcessGroup& group) {
  const int64_t width = group.rank() == 1 ? ddp_test::kHidden + 1 : ddp_test::kHidden;
  torch::nn::Sequential net(torch::nn::Linear(ddp_test::kIn, width), torch::nn::ReLU(),
                            torch::nn::Linear(width, ddp_test::kOut));
  try {
    ddp::DistributedDataParallel model(net);
  } catch (const c10::Error& e) {
    // The first difference is '0.weight': [16, 8] on rank 0, [17, 8] on rank 1.
    return expect_message(e.what(), {"0.weight", "[16, 8]", "[17, 8]"});
  }
  std::printf("FAILED: DistributedDataParallel accepted models that differ across ranks\n");
  return 1;
}

int unused_parameter(ddp::ProcessGroup& group, const char* bucket_sizes,
                     const ddp::DistributedDataParallelOptions& options) {
  std::printf("buckets %s:\n", bucket_sizes);
  ddp_test::BranchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  auto [x, y] = ddp_test::rank_batch(0, group.rank(), group.size());
  try {
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
  } catch (const std::exception& e) {
    std::printf("FAILED: the first iteration failed; the error belongs to the next forward: %s\n",
                e.what());
    return 1;
  }
  try {
    optimizer.zero_grad();
    auto output = model(x);
  } catch (const c10::Error& e) {
    return expect_message(e.what(), {"expected to have finished reduction in the prior iteration",
                                     "extra.weight", "extra.bias"});
  }
  std::printf("FAILED: the forward after an unfinished reduction did not fail\n");
  return 1;
}

int join_disagree(ddp::ProcessGroup& group) {
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net);
  auto [x, y] = ddp_test::rank_batch(0, group.rank(), group.size());
  try {
    ddp::Join join(model);
    if (group.rank() == 0) {
      auto guard = model->no_sync();
      torch::mse_loss(model(x), y).backward();
    } else {
      torch::mse_loss(model(x), y).backward();
    }
  } catch (const c10::Error& e) {
    return expect_message(
        e.what(), {"[rank " + std::to_string(group.rank()) + "/", "ddp::Join",
                   // Every rank but rank 0 reduces gradients.
                   std::to_string(group.size() - 1) + " of the " + std::to_string(group.size()) +
                       " ranks still training reduce gradients in this step, expected all or none",
                   "no_sync()"});
  }
  std::printf("FAILED: ranks that disagree on no_sync() under Join were not reported\n");
  return 1;
}

// throw_on_early_termination: rank 0 has one batch, the others three. Rank
// 0's finish() must throw saying it exhausted its inputs, every other rank's
// second forward must throw naming rank 0, and the group must stay usable.
int join_throw(ddp::ProcessGroup& group) {
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net);
  const int batches = group.rank() == 0 ? 1 : 3;
  int steps = 0;
  std::string message;
  try {
    ddp::Join join(model, ddp::JoinOptions().throw_on_early_termination(true));
    for (int step = 0; step < batches; ++step) {
      auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
      torch::mse_loss(model(x), y).backward();
      ++steps;
    }
    join.finish();
  } catch (const c10::Error& e) {
    message = e.what();
  }
  if (message.empty() || steps != 1) {
    std::printf("FAILED: throw_on_early_termination: %d steps, error '%s'; expected 1 step and an error\n", steps,
                message.c_str());
    return 1;
  }
  const std::string me = "[rank " + std::to_string(group.rank()) + "/" + std::to_string(group.size()) + "] ddp::Join: ";
  int status = group.rank() == 0
                   ? expect_message(message, {me + "this rank exhausted its inputs after 1 steps while " +
                                                  std::to_string(group.size() - 1) + " rank(s) still train",
                                              "throw_on_early_termination"})
                   : expect_message(message, {me + "detected that rank(s) 0 exhausted their inputs after this "
                                                   "rank's 1 steps",
                                              "throw_on_early_termination"});
  // Every rank threw at the same collective: the group still works, and so
  // does the model (a synchronised step without Join).
  auto token = torch::ones({1});
  group.allreduce(token)->wait();
  auto [x, y] = ddp_test::rank_batch(5, group.rank(), group.size());
  torch::mse_loss(model(x), y).backward();
  if (token.item<float>() != static_cast<float>(group.size())) {
    std::printf("FAILED: the group is not usable after throw_on_early_termination\n");
    status = 1;
  }
  return status;
}

// `extra` is used when the caller says so.
struct SwitchNetImpl : torch::nn::Module {
  SwitchNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden))),
        extra(register_module("extra", torch::nn::Linear(ddp_test::kHidden, ddp_test::kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))) {}

  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    auto h = torch::relu(fc1(x));
    if (use_extra) {
      h = h + torch::tanh(extra(h));
    }
    return fc2(h);
  }

  torch::nn::Linear fc1, extra, fc2;
};
TORCH_MODULE(SwitchNet);

const ddp::DistributedDataParallelOptions kTinyBuckets =
    ddp::DistributedDataParallelOptions().first_bucket_cap_mb(0.0001).bucket_cap_mb(0.0001);

// One synchronised step with `extra` used or not; false (with the error
// printed) if it throws.
bool step_ok(ddp::ProcessGroup& group, SwitchNet& net, ddp::DistributedDataParallel& model,
             bool use_extra, const char* what) {
  auto [x, y] = ddp_test::rank_batch(0, group.rank(), group.size());
  try {
    net->zero_grad();
    torch::mse_loss(model(x, use_extra), y).backward();
    return true;
  } catch (const std::exception& e) {
    std::printf("FAILED: %s failed: %s\n", what, e.what());
    return false;
  }
}

// A layer unused in the first iteration is used in the second.
int static_graph_grows(ddp::ProcessGroup& group, const char* bucket_sizes,
                       ddp::DistributedDataParallelOptions options) {
  std::printf("static_graph, extra used from the second iteration, buckets %s:\n", bucket_sizes);
  SwitchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options.static_graph(true));
  if (!step_ok(group, net, model, false, "the first iteration (extra unused)")) {
    return 1;
  }
  auto [x, y] = ddp_test::rank_batch(1, group.rank(), group.size());
  try {
    torch::mse_loss(model(x, true), y).backward();
  } catch (const c10::Error& e) {
    return expect_message(e.what(), {"[rank " + std::to_string(group.rank()) + "/",
                                     "static_graph", "parameter 'extra.",
                                     "got gradient number 1 in this backward, but the first "
                                     "iteration gave it 0",
                                     "training graph changed"});
  }
  std::printf("FAILED: a backward that used a parameter unused in the first static_graph "
              "iteration did not fail\n");
  return 1;
}

// A layer used in the first iteration goes unused in the second.
int static_graph_shrinks(ddp::ProcessGroup& group, const char* bucket_sizes,
                         ddp::DistributedDataParallelOptions options) {
  std::printf("static_graph, extra unused from the second iteration, buckets %s:\n", bucket_sizes);
  SwitchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options.static_graph(true));
  if (!step_ok(group, net, model, true, "the first iteration (extra used)") ||
      !step_ok(group, net, model, false,
               "the second iteration (extra unused; the error belongs to the next forward)")) {
    return 1;
  }
  auto [x, y] = ddp_test::rank_batch(2, group.rank(), group.size());
  try {
    auto output = model(x, true);
  } catch (const c10::Error& e) {
    return expect_message(e.what(), {"[rank " + std::to_string(group.rank()) + "/",
                                     "expected to have finished reduction in the prior iteration",
                                     "static_graph", "extra.weight (0 of 1)", "extra.bias (0 of 1)",
                                     "training graph changed"});
  }
  std::printf("FAILED: the forward after a static_graph iteration that left a parameter without "
              "its gradient did not fail\n");
  return 1;
}

int static_graph_changed(ddp::ProcessGroup& group) {
  int status = static_graph_grows(group, "default", {});
  status |= static_graph_grows(group, "tiny", kTinyBuckets);
  status |= static_graph_shrinks(group, "default", {});
  status |= static_graph_shrinks(group, "tiny", kTinyBuckets);
  return status;
}

constexpr std::chrono::milliseconds kShortTimeout{10000};

// Only rank 0's graph changes.
int static_graph_changed_on_one_rank(ddp::ProcessGroup& group) {
  SwitchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions().static_graph(true));
  if (!step_ok(group, net, model, false, "the first iteration (extra unused)")) {
    return 1;
  }
  auto [x, y] = ddp_test::rank_batch(1, group.rank(), group.size());
  const auto start = std::chrono::steady_clock::now();
  try {
    torch::mse_loss(model(x, group.rank() == 0), y).backward();
  } catch (const c10::Error& e) {
    if (group.rank() == 0) {
      return expect_message(e.what(), {"[rank 0/", "static_graph", "parameter 'extra.",
                                       "training graph changed"});
    }
    std::printf("FAILED: rank %d, whose graph did not change, got a usage error: %s\n",
                group.rank(), e.what());
    return 1;
  } catch (const std::exception& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    if (group.rank() == 0) {
      std::printf("FAILED: rank 0 got a communication error instead of the usage error: %s\n",
                  e.what());
      return 1;
    }
    if (waited > kShortTimeout + std::chrono::seconds(10)) {
      std::printf("FAILED: rank %d's error came after %lld ms, beyond the %lld ms timeout: %s\n",
                  group.rank(), static_cast<long long>(waited.count()),
                  static_cast<long long>(kShortTimeout.count()), e.what());
      return 1;
    }
    std::printf("expected error after %lld ms: %s\n", static_cast<long long>(waited.count()),
                first_line(e.what()).c_str());
    return 0;
  }
  std::printf("FAILED: rank %d's backward did not fail\n", group.rank());
  return 1;
}

// Without static_graph, a layer whose hook fires twice in one backward.
int reused_parameter(ddp::ProcessGroup& group) {
  ddp_test::TwiceNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  auto [x, y] = ddp_test::rank_batch(0, group.rank(), group.size());
  try {
    torch::mse_loss(model(x), y).backward();
  } catch (const c10::Error& e) {
    return expect_message(e.what(), {"[rank " + std::to_string(group.rank()) + "/",
                                     "parameter 'shared.", "marked ready twice",
                                     "static_graph(true)"});
  }
  std::printf("FAILED: a parameter whose hook fired twice without static_graph was not reported\n");
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  try {
    auto group = ddp::init_process_group(
        which == "static-graph-changed-one-rank" ? ddp::InitOptions().timeout(kShortTimeout)
                                                 : ddp::InitOptions());
    int status = 1;
    if (which == "models-differ") {
      status = models_differ(*group);
    } else if (which == "unused-parameter") {
      // One bucket for everything (nothing is launched), then one bucket per
      // layer (the used layers' buckets are launched and reduced).
      status = unused_parameter(*group, "default", {});
      status |= unused_parameter(
          *group, "tiny",
          ddp::DistributedDataParallelOptions().first_bucket_cap_mb(0.0001).bucket_cap_mb(0.0001));
    } else if (which == "join-disagree") {
      status = join_disagree(*group);
    } else if (which == "join-throw") {
      status = join_throw(*group);
    } else if (which == "static-graph-changed") {
      status = static_graph_changed(*group);
    } else if (which == "static-graph-changed-one-rank") {
      status = static_graph_changed_on_one_rank(*group);
    } else if (which == "reused-parameter") {
      status = reused_parameter(*group);
    } else {
      std::fprintf(stderr,
                   "usage: ddp_errors_main models-differ|unused-parameter|join-disagree|join-throw|"
                   "static-graph-changed|static-graph-changed-one-rank|reused-parameter\n");
      return 2;
    }
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::printf("FAILED: unexpected error: %s\n", e.what());
    return 1;
  }
}
