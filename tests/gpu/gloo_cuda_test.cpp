// The Gloo backend with CUDA tensors: world size 2, both ranks as threads of
// this process on one GPU (Gloo stages CUDA tensors through pinned host
// memory, so two ranks may share a device, which NCCL does not allow).
// Results are checked in closed form, as in process_group_gloo_test.cpp.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/comm/process_group_gloo.h>

#include "gpu/gpu_testing.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp::testing::make_gloo_group;
using ddp::testing::run_threads;
using ddp_gpu_test::cuda;

constexpr int kWorld = 2;

at::Tensor pattern(int64_t count) {
  return torch::arange(count, torch::kLong).remainder(5);
}

class GlooCuda : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
  }
};

TEST_P(GlooCuda, AllreduceSumAvgMaxAndBitwise) {
  const int64_t count = GetParam();
  run_threads(kWorld, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, kWorld);
    auto sum = (pattern(count) + rank).to(torch::kFloat).to(cuda());
    pg->allreduce(sum)->wait();
    EXPECT_TRUE(torch::equal(sum.cpu(), (pattern(count) * 2 + 1).to(torch::kFloat)));

    auto avg = (pattern(count) + rank).to(torch::kBFloat16).to(cuda());
    pg->allreduce(avg, {ReduceOp::kAvg})->wait();
    EXPECT_TRUE(torch::equal(avg.cpu(), (pattern(count).to(torch::kDouble) + 0.5).to(torch::kBFloat16)));

    auto max = (pattern(count) + rank).to(torch::kInt).to(cuda());
    pg->allreduce(max, {ReduceOp::kMax})->wait();
    EXPECT_TRUE(torch::equal(max.cpu(), (pattern(count) + 1).to(torch::kInt)));

    // What NCCL cannot do, Gloo does on CUDA tensors too.
    auto bits = torch::full({count}, int64_t{1} << rank, torch::dtype(torch::kLong).device(cuda()));
    pg->allreduce(bits, {ReduceOp::kBor})->wait();
    EXPECT_TRUE(torch::equal(bits.cpu(), torch::full({count}, int64_t{3}, torch::kLong)));
  });
}

TEST_P(GlooCuda, CoalescedBroadcastAndAllgather) {
  const int64_t count = GetParam();
  run_threads(kWorld, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, kWorld);
    auto a = torch::full({count}, rank + 1.0, cuda());
    auto b = torch::full({2, 3}, 2.0 * rank, cuda());
    pg->allreduce_coalesced({a, b})->wait();
    EXPECT_TRUE(torch::equal(a.cpu(), torch::full({count}, 3.0)));
    EXPECT_TRUE(torch::equal(b.cpu(), torch::full({2, 3}, 2.0)));

    auto from_root = (pattern(count) + 10 * rank).to(torch::kHalf).to(cuda());
    pg->broadcast(from_root, {1})->wait();
    EXPECT_TRUE(torch::equal(from_root.cpu(), (pattern(count) + 10).to(torch::kHalf)));

    auto input = (pattern(count) + 100 * rank).to(torch::kInt).to(cuda());
    std::vector<at::Tensor> outputs = {torch::empty({count}, torch::dtype(torch::kInt).device(cuda())),
                                       torch::empty({count}, torch::dtype(torch::kInt).device(cuda()))};
    pg->allgather(outputs, input)->wait();
    auto flat = torch::empty({kWorld * count}, torch::dtype(torch::kInt).device(cuda()));
    pg->allgather_into_tensor(flat, input)->wait();
    for (int r = 0; r < kWorld; ++r) {
      const auto expected = (pattern(count) + 100 * r).to(torch::kInt);
      EXPECT_TRUE(torch::equal(outputs[r].cpu(), expected)) << "from rank " << r;
      EXPECT_TRUE(torch::equal(flat.narrow(0, r * count, count).cpu(), expected)) << "from rank " << r;
    }
  });
}

TEST_P(GlooCuda, ReduceScatterAlltoallAndPointToPoint) {
  const int64_t count = GetParam();
  run_threads(kWorld, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, kWorld);
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < kWorld; ++r) {
      inputs.push_back((pattern(count) + rank + 10 * r).to(torch::kFloat).to(cuda()));
    }
    auto reduced = torch::empty({count}, cuda());
    pg->reduce_scatter(reduced, inputs)->wait();
    EXPECT_TRUE(torch::equal(reduced.cpu(), (pattern(count) * 2 + 1 + 20 * rank).to(torch::kFloat)));

    auto mine = torch::cat({pattern(count) + 100 * rank, pattern(count) + 100 * rank + 10}).to(cuda());
    auto theirs = torch::empty_like(mine);
    pg->alltoall(theirs, mine)->wait();
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(torch::equal(theirs.narrow(0, r * count, count).cpu(), pattern(count) + 100 * r + 10 * rank));
    }

    auto message = (pattern(count) + 7).to(torch::kDouble).to(cuda());
    if (rank == 0) {
      pg->send(message, 1, {3})->wait();
    } else {
      auto received = torch::zeros_like(message);
      pg->recv(received, 0, {3})->wait();
      EXPECT_TRUE(torch::equal(received.cpu(), message.cpu()));
    }
    pg->barrier()->wait();
  });
}

// Note [Gloo and CUDA streams]: a tensor written on a non-blocking pool
// stream, behind a long kernel, is reduced only once the write has landed,
// and the result is there for the caller's stream once wait() returns.
TEST(GlooCudaStreams, CollectiveWaitsForTheCallersStreamAndItsResultFollowsWait) {
  DDP_REQUIRE_GPUS(1);
  constexpr int64_t kCount = 1 << 16;
  run_threads(kWorld, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, kWorld);
    auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
    c10::cuda::CUDAStreamGuard guard(stream);
    auto tensor = torch::zeros({kCount}, cuda());
    ddp_gpu_test::keep_stream_busy(std::chrono::milliseconds(300));
    tensor.fill_(rank + 1.0); // queued behind the busy kernel
    auto work = pg->allreduce(tensor);
    work->wait();
    tensor.mul_(2.0); // the caller's next kernel, on its own stream
    EXPECT_TRUE(torch::equal(tensor.cpu(), torch::full({kCount}, 6.0)))
        << "rank " << rank << " got " << tensor.cpu().slice(0, 0, 4);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooCuda,
                         ::testing::Values(int64_t{0}, int64_t{1}, int64_t{7}, int64_t{(1 << 18) + 3}),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "N" + std::to_string(info.param);
                         });

} // namespace
} // namespace ddp
