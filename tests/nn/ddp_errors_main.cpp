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
// Each rank prints "expected error: ..." and exits 0, or says what went wrong
// and exits 1.

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"

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

} // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  try {
    auto group = ddp::init_process_group();
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
    } else {
      std::fprintf(stderr, "usage: ddp_errors_main models-differ|unused-parameter|join-disagree\n");
      return 2;
    }
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::printf("FAILED: unexpected error: %s\n", e.what());
    return 1;
  }
}
