// The PowerSGD hook called directly on hand-made buckets, over a fake group:
// the order of its collectives (Note [PowerSGD collective order]), errors of
// either allreduce reaching the bucket's Work at once, exact reconstruction
// at full rank, the division by the world size, and the error feedback.
// Training on real processes: powersgd_main.cpp and the PyTorch parity test.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "testing/errors.h"
#include "testing/fake_process_group.h"

namespace ddp {
namespace {

using comm_hooks::PowerSGDOptions;
using comm_hooks::PowerSGDState;

// A group of `size` ranks that all hold this rank's tensors (allreduce
// multiplies by the size), of which PowerSGD may ask only allreduces; the
// one numbered `fail_at` (from 0) fails.
struct MirrorGroup : testing::FakeProcessGroup {
  explicit MirrorGroup(int size, int fail_at = -1) : FakeProcessGroup(0, size) {
    mirror = true;
    fail_allreduce_at = fail_at;
    expected_ops = {"allreduce"};
  }
};

// A bucket of a rows x cols weight and its bias (rows), in a flat buffer
// filled with distinct values.
struct TestBucket {
  at::Tensor buffer;
  std::vector<at::Tensor> gradients;
  std::shared_ptr<const std::vector<std::string>> names;

  TestBucket(int64_t rows, int64_t cols, double scale = 1.0) {
    buffer = torch::sin(torch::arange(rows * cols + rows, torch::kFloat) * 0.7 + scale) * scale;
    gradients = {buffer.narrow(0, 0, rows * cols).view({rows, cols}),
                 buffer.narrow(0, rows * cols, rows)};
    names = std::make_shared<const std::vector<std::string>>(
        std::vector<std::string>{"weight", "bias"});
  }
  GradBucket bucket(size_t index, size_t count) const {
    return GradBucket(index, count, buffer, gradients, names);
  }
};

// Runs one iteration of `hook` over `buckets`, the way the Reducer does:
// every hook call, then a wait on each Work.
std::vector<at::Tensor> iterate(CommHook& hook, ProcessGroup& group,
                                std::vector<TestBucket>& buckets) {
  std::vector<std::shared_ptr<Work>> works;
  for (size_t b = 0; b < buckets.size(); ++b) {
    GradBucket bucket = buckets[b].bucket(b, buckets.size());
    works.push_back(hook(group, bucket));
  }
  std::vector<at::Tensor> results;
  for (auto& work : works) {
    work->wait(std::chrono::seconds(5));
    results.push_back(work->result()[0]);
  }
  return results;
}

PowerSGDOptions compress_at_once() {
  return PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false);
}

TEST(PowerSGDHook, CollectivesInBucketOrderWithQOneBucketBehind) {
  MirrorGroup group(2);
  auto state = std::make_shared<PowerSGDState>(compress_at_once());
  auto hook = comm_hooks::powerSGD(state);
  std::vector<TestBucket> buckets{{16, 8}, {16, 8}, {16, 8}};
  iterate(hook, group, buckets);
  // Bucket: bias (16) + P (16 x 1) in one allreduce, then Q (8 x 1).
  EXPECT_EQ(group.allreduce_numels, (std::vector<int64_t>{32, 32, 8, 32, 8, 8}));
  EXPECT_EQ(state->allreduce_calls(), 6u);
  EXPECT_EQ(state->bytes_allreduced(), 4u * (3 * 32 + 3 * 8));
  EXPECT_EQ(state->iteration(), 1);
}

TEST(PowerSGDHook, PlainAllreduceBeforeStart) {
  MirrorGroup group(2);
  auto state = std::make_shared<PowerSGDState>(PowerSGDOptions().start_powerSGD_iter(2));
  auto hook = comm_hooks::powerSGD(state);
  std::vector<TestBucket> buckets{{16, 8}, {16, 8}};
  const auto before = buckets[0].buffer.clone();
  auto results = iterate(hook, group, buckets);
  EXPECT_EQ(group.allreduce_numels, (std::vector<int64_t>{144, 144}));
  // Divided by 2, summed over 2 identical ranks: unchanged.
  EXPECT_TRUE(torch::allclose(results[0], before));
  iterate(hook, group, buckets);
  EXPECT_EQ(state->iteration(), 2);
  iterate(hook, group, buckets); // compresses from here
  EXPECT_EQ(group.allreduce_numels.size(), 4u + 4u);
}

TEST(PowerSGDHook, FullRankReconstructsTheGradient) {
  // r = min(n, m) = 8, always worth compressing: P spans M's columns (QR
  // path, r > 2), so P Q^T is M itself.
  for (int size : {1, 2, 3}) {
    MirrorGroup group(size);
    auto state = std::make_shared<PowerSGDState>(
        compress_at_once().matrix_approximation_rank(8).min_compression_rate(0));
    auto hook = comm_hooks::powerSGD(state);
    std::vector<TestBucket> buckets{{16, 8}};
    const auto before = buckets[0].buffer.clone();
    auto results = iterate(hook, group, buckets);
    EXPECT_LT((results[0] - before).abs().max().item<double>(), 1e-5) << "world size " << size;
  }
}

TEST(PowerSGDHook, SameResultOnIdenticalRanksAsAlone) {
  // W ranks holding the same gradients must get what one rank gets: the
  // uncompressed part and Q are divided by the world size, P needs not be.
  std::vector<at::Tensor> alone;
  for (int size : {1, 2, 3}) {
    MirrorGroup group(size);
    auto state = std::make_shared<PowerSGDState>(PowerSGDOptions().start_powerSGD_iter(2));
    auto hook = comm_hooks::powerSGD(state);
    std::vector<TestBucket> buckets{{16, 8, 1.0}, {16, 16, 2.0}};
    std::vector<at::Tensor> results;
    for (int step = 0; step < 5; ++step) {
      for (auto& b : buckets) {
        b.buffer.copy_(torch::cos(torch::arange(b.buffer.numel(), torch::kFloat) * (step + 1)));
      }
      results = iterate(hook, group, buckets);
    }
    const auto flat = torch::cat({results[0].clone(), results[1].clone()});
    if (size == 1) {
      alone.push_back(flat);
    } else {
      EXPECT_LT((flat - alone[0]).abs().max().item<double>(), 1e-5) << "world size " << size;
    }
  }
}

TEST(PowerSGDHook, ErrorFeedbackIsWhatCompressionLost) {
  MirrorGroup group(1);
  auto state = std::make_shared<PowerSGDState>(PowerSGDOptions().start_powerSGD_iter(2));
  auto hook = comm_hooks::powerSGD(state);
  std::vector<TestBucket> buckets{{16, 16}};
  iterate(hook, group, buckets);
  iterate(hook, group, buckets);
  EXPECT_FALSE(state->error(0).defined());
  const auto input = buckets[0].buffer.clone();
  auto results = iterate(hook, group, buckets);
  ASSERT_TRUE(state->error(0).defined());
  // Rank 1 of a 16 x 16 matrix of full rank loses something; the bias (alone
  // on one rank) loses nothing.
  EXPECT_TRUE(torch::allclose(state->error(0), input - results[0], 1e-5, 1e-6));
  EXPECT_GT(state->error(0).narrow(0, 0, 256).abs().max().item<double>(), 1e-3);
  EXPECT_EQ(state->error(0).narrow(0, 256, 16).abs().max().item<double>(), 0.0);
  // The approximation has rank 1.
  const auto singular = torch::linalg_svdvals(results[0].narrow(0, 0, 256).view({16, 16}));
  EXPECT_LT(singular[1].item<double>(), 1e-4 * singular[0].item<double>());
  const auto stats = state->compression_stats();
  EXPECT_EQ(stats.numel_before, 272);
  EXPECT_EQ(stats.numel_after, 32 + 16);
}

TEST(PowerSGDHook, FailedAllreduceFailsTheBucketAtOnce) {
  // Allreduce #0 is bucket 0's P, #2 its Q (after bucket 1's P).
  for (int fail_at : {0, 2}) {
    MirrorGroup group(2, fail_at);
    auto state = std::make_shared<PowerSGDState>(compress_at_once());
    auto hook = comm_hooks::powerSGD(state);
    std::vector<TestBucket> buckets{{16, 8}, {16, 8}};
    std::vector<std::shared_ptr<Work>> works;
    for (size_t b = 0; b < buckets.size(); ++b) {
      GradBucket bucket = buckets[b].bucket(b, buckets.size());
      works.push_back(hook(group, bucket));
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      works[0]->wait(std::chrono::seconds(20));
      ADD_FAILURE() << "bucket 0's Work succeeded although allreduce #" << fail_at << " failed";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("lost connection to rank 1"), std::string::npos)
          << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_TRUE(works[0]->is_completed());
    EXPECT_FALSE(works[0]->is_success());
    works[1]->wait(std::chrono::seconds(5)); // bucket 1 is not affected
  }
}

TEST(PowerSGDHook, OptionsAreChecked) {
  DDP_EXPECT_ERROR(PowerSGDState(PowerSGDOptions().start_powerSGD_iter(1)),
                   "start_powerSGD_iter must be at least 2 with use_error_feedback or warm_start "
                   "(got 1)");
  DDP_EXPECT_ERROR(PowerSGDState(PowerSGDOptions().matrix_approximation_rank(0)),
                   "matrix_approximation_rank must be at least 1 (got 0)");
  DDP_EXPECT_ERROR(PowerSGDState(PowerSGDOptions().min_compression_rate(-1)),
                   "min_compression_rate must not be negative (got -1)");
  DDP_EXPECT_ERROR(comm_hooks::powerSGD(nullptr), "the state is null");
}

} // namespace
} // namespace ddp
