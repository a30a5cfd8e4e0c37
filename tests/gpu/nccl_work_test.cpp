// Work::wait on the NCCL backend, at world size 1 on one GPU.
//
// The operation must wait, on the GPU, for what the caller queued before it;
// wait() without a timeout must order the caller's stream after the
// operation without blocking the CPU; wait(timeout) must block the CPU until
// the GPU is done, or throw TimeoutError at the deadline. A spinning kernel
// (at::cuda::sleep) keeps the caller's stream busy for a known time, so that
// "did not block" and "did wait" are visible from the CPU.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_nccl.h>

#include "gpu/gpu_testing.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;
using ddp_gpu_test::keep_stream_busy;
using ddp_gpu_test::message_of;
using ddp_gpu_test::stream_busy;
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

class NcclWork : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
    group_ = ddp_gpu_test::make_nccl_group_of_one();
    // The first operation creates the communicator; keep that out of the
    // timed parts.
    group_->allreduce(torch::ones({1}, cuda()))->wait(std::chrono::seconds(60));
  }

  std::shared_ptr<ProcessGroupNCCL> group_;
};

TEST_F(NcclWork, OperationWaitsForWhatTheCallerQueuedBefore) {
  auto input = torch::zeros({1 << 20}, cuda());
  auto output = torch::empty_like(input);
  keep_stream_busy(std::chrono::milliseconds(300));
  input.fill_(1.0); // queued behind the spin
  group_->allgather_into_tensor(output, input)->wait();
  // Without the ordering, NCCL would have copied the zeros.
  EXPECT_TRUE(torch::all(output.cpu() == 1).item<bool>());
}

TEST_F(NcclWork, WaitWithoutTimeoutOrdersTheStreamWithoutBlockingTheCpu) {
  auto input = torch::full({1 << 20}, 3.0, cuda());
  auto output = torch::empty_like(input);
  // Judged against the stream's busy time: a wait() that blocked the CPU
  // would return only when the stream is done, after all of it.
  constexpr std::chrono::milliseconds kBusy(1500);
  keep_stream_busy(kBusy);
  auto work = group_->allgather_into_tensor(output, input);
  const auto start = Clock::now();
  work->wait();
  EXPECT_LT(since(start), kBusy / 2) << "wait() blocked the CPU";
  EXPECT_TRUE(stream_busy()) << "the GPU should still be spinning";
  EXPECT_TRUE(work->is_completed()) << "the caller's stream is ordered: the Work counts as completed";
  output.mul_(2); // on the caller's stream: after the allgather
  EXPECT_TRUE(torch::all(output.cpu() == 6).item<bool>());
}

TEST_F(NcclWork, WaitWithTimeoutBlocksUntilTheGpuIsDone) {
  auto input = torch::full({1 << 20}, 5.0, cuda());
  auto output = torch::empty_like(input);
  const auto start = Clock::now();
  keep_stream_busy(std::chrono::milliseconds(400));
  auto work = group_->allgather_into_tensor(output, input);
  work->wait(std::chrono::seconds(30));
  EXPECT_GE(since(start), std::chrono::milliseconds(400));
  EXPECT_TRUE(work->is_success());
  EXPECT_FALSE(stream_busy());
  EXPECT_TRUE(torch::all(output.cpu() == 5).item<bool>());
}

TEST_F(NcclWork, ShortWaitTimesOutAndTheOperationStillCompletes) {
  auto tensor = torch::ones({16}, cuda());
  keep_stream_busy(std::chrono::milliseconds(2000));
  auto work = group_->allreduce(tensor);
  auto message = message_of<TimeoutError>([&] { work->wait(std::chrono::milliseconds(100)); });
  EXPECT_NE(message.find("[rank 0/1] allreduce #1: wait timed out after 100 ms"), std::string::npos)
      << message;
  work->wait(std::chrono::seconds(30)); // the group's 60 s deadline has not passed
  EXPECT_TRUE(work->is_success());
}

TEST_F(NcclWork, CompletesWithoutWaitAndRunsThenCallbacks) {
  auto tensor = torch::full({8}, 2.0, cuda());
  auto work = group_->allreduce(tensor);
  auto doubled = work->then([](const std::vector<at::Tensor>& result) {
    return std::vector<at::Tensor>{result[0] * 2};
  });
  // Nobody waits on `work`: the watchdog completes it, then runs the callback.
  doubled->wait(std::chrono::seconds(30));
  EXPECT_TRUE(work->is_completed());
  ASSERT_EQ(doubled->result().size(), 1u);
  EXPECT_TRUE(torch::equal(doubled->result()[0].cpu(), torch::full({8}, 4.0)));
}

TEST_F(NcclWork, ResultIsTheOutputTensor) {
  auto tensor = torch::full({8}, 7.0, cuda());
  auto work = group_->allreduce(tensor);
  work->wait();
  ASSERT_EQ(work->result().size(), 1u);
  EXPECT_TRUE(work->result()[0].is_same(tensor));
}

TEST_F(NcclWork, CallerMayDropTheTensorsAtOnce) {
  // The Work (and the caching allocator, through recordStream) keeps the
  // memory until the GPU is done with it.
  keep_stream_busy(std::chrono::milliseconds(300));
  std::shared_ptr<Work> work;
  {
    auto input = torch::full({1 << 20}, 1.0, cuda());
    auto output = torch::empty_like(input);
    work = group_->allgather_into_tensor(output, input);
  }
  auto reuse = torch::full({1 << 20}, 9.0, cuda()); // may take the freed block
  work->wait(std::chrono::seconds(30));
  EXPECT_TRUE(work->is_success());
  EXPECT_TRUE(torch::all(reuse.cpu() == 9).item<bool>());
}

TEST_F(NcclWork, BarrierWaitBlocksTheCpu) {
  keep_stream_busy(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  group_->barrier()->wait();
  EXPECT_GE(since(start), std::chrono::milliseconds(250));
}

} // namespace
} // namespace ddp
