// No silent hangs on the NCCL backend: deadlines at communicator creation,
// the watchdog's timeout and abort, and the group's unusable state after.
//
// - A peer that never comes: world size 2 where only rank 0 runs. The
//   rendezvous deadline names the missing rank.
// - A peer that arrives in the store but never creates its communicator:
//   the non-blocking ncclCommInitRankConfig is abandoned at the deadline.
// - An operation stuck on the GPU (on one GPU: its stream waits behind a
//   spinning kernel; on two: a rank skips a collective): the watchdog fails
//   it with TimeoutError, aborts the communicator, and every later
//   operation fails at once.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <ddp/comm/error.h>
#include <ddp/store/hash_store.h>
#include <ddp/comm/process_group_nccl.h>

#include "gpu/gpu_testing.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;
using ddp_gpu_test::keep_stream_busy;
using ddp_gpu_test::message_of;
using Clock = std::chrono::steady_clock;

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in: " << message;
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

TEST(NcclWatchdog, PeerThatNeverComesTimesOutNamingIt) {
  DDP_REQUIRE_GPUS(1);
  auto group = ProcessGroupNCCL::create(
      std::make_shared<HashStore>(), 0, 2,
      ProcessGroupNCCLOptions()
          .timeout(std::chrono::seconds(2))
          .group_name(ddp_gpu_test::fresh_group_name())
          .device_index(0));
  const auto start = Clock::now();
  auto work = group->barrier();
  const auto message = message_of<TimeoutError>([&] { work->wait(); });
  EXPECT_LT(since(start), std::chrono::seconds(20));
  expect_contains(message, "[rank 0/2] barrier #0: creating the NCCL communicator");
  expect_contains(message, "rank(s) [1] of 2 never arrived");

  // The group is unusable from now on, and says so at once.
  auto later = group->allreduce(torch::ones({4}, cuda()));
  expect_contains(message_of<CommError>([&] { later->wait(); }),
                  "allreduce #1: not run, because the process group failed earlier");
}

TEST(NcclWatchdog, PeerThatNeverCreatesItsCommunicatorTimesOut) {
  DDP_REQUIRE_GPUS(1);
  auto store = std::make_shared<HashStore>();
  const std::string name = ddp_gpu_test::fresh_group_name();
  // Rank 1's arrival, written by hand: the keys of ensure_communicator's
  // rendezvous (src/comm/nccl/nccl_engine.cpp, gloo_rendezvous.cpp) for the first
  // group of this name. Rank 0 then gets past the store and waits in NCCL.
  const std::string prefix = "ddp/" + name + "/nccl/0/";
  store->add(prefix + "claim/1", 1);
  store->set(prefix + "arrived/1", std::string("2"));
  auto group = ProcessGroupNCCL::create(
      store, 0, 2,
      ProcessGroupNCCLOptions().timeout(std::chrono::seconds(3)).group_name(name).device_index(0));
  const auto start = Clock::now();
  auto work = group->allreduce(torch::ones({4}, cuda()));
  const auto message = message_of<TimeoutError>([&] { work->wait(); });
  EXPECT_LT(since(start), std::chrono::seconds(30));
  expect_contains(message, "[rank 0/2] allreduce #0: creating the NCCL communicator");
  expect_contains(message, "timed out after 3000 ms waiting for NCCL");
}

TEST(NcclWatchdog, StuckOperationTimesOutAndAbortsTheGroup) {
  DDP_REQUIRE_GPUS(1);
  auto group = ddp_gpu_test::make_nccl_group_of_one(std::chrono::seconds(60));
  auto tensor = torch::ones({1024}, cuda());
  group->allreduce(tensor)->wait(std::chrono::seconds(60)); // #0 creates the communicator

  // The communicator's stream waits behind 5 s of spinning; the operation's
  // own deadline is 500 ms.
  keep_stream_busy(std::chrono::milliseconds(5000));
  const auto start = Clock::now();
  auto stuck = group->allreduce(tensor, {ReduceOp::kSum, std::chrono::milliseconds(500)});
  const auto message = message_of<TimeoutError>([&] { stuck->wait(std::chrono::seconds(30)); });
  EXPECT_LT(since(start), std::chrono::milliseconds(4000)) << "the watchdog should fire near 500 ms";
  expect_contains(message, "[rank 0/1] allreduce #1 timed out after 500 ms");
  expect_contains(message, "aborted");

  auto later = group->broadcast(tensor);
  expect_contains(message_of<CommError>([&] { later->wait(); }),
                  "broadcast #2: not run, because the process group failed earlier and is unusable");
  torch::cuda::synchronize(); // let the spin end before the next test
}

TEST(NcclWatchdog, DestroyingAGroupWithAStuckOperationDoesNotHang) {
  DDP_REQUIRE_GPUS(1);
  auto group = ddp_gpu_test::make_nccl_group_of_one(std::chrono::seconds(60));
  auto tensor = torch::ones({16}, cuda());
  group->allreduce(tensor)->wait(std::chrono::seconds(60));
  keep_stream_busy(std::chrono::milliseconds(5000));
  group->allreduce(tensor, {ReduceOp::kSum, std::chrono::milliseconds(500)});
  // Nobody waits. The destructor lets the watchdog end the operation at its
  // 500 ms deadline; the abort may then wait for the spin to end (NCCL
  // cannot cancel work queued behind it), so the bound is the spin, not the
  // deadline.
  const auto start = Clock::now();
  group.reset();
  EXPECT_LT(since(start), std::chrono::seconds(20));
  torch::cuda::synchronize();
}

TEST(NcclWatchdog, CollectiveThatAPeerSkipsTimesOut) {
  DDP_REQUIRE_GPUS(2);
  const std::string name = ddp_gpu_test::fresh_group_name();
  std::atomic<bool> rank0_done{false};
  ddp::testing::run_threads(2, [&](int rank, std::shared_ptr<Store> store) {
    auto group = ProcessGroupNCCL::create(
        store, rank, 2,
        ProcessGroupNCCLOptions().timeout(std::chrono::seconds(10)).group_name(name).device_index(rank));
    auto tensor = torch::ones({1024}, cuda(rank));
    group->allreduce(tensor)->wait(std::chrono::seconds(60)); // both ranks: #0
    if (rank == 1) {
      // Skips #1 but stays alive, as a stuck peer would, until rank 0 has
      // seen its error: destroying the communicator while rank 0's kernel
      // still reads from this GPU is not the case under test.
      const auto give_up = Clock::now() + std::chrono::seconds(60);
      while (!rank0_done.load() && Clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;
    }
    auto work = group->allreduce(tensor, {ReduceOp::kSum, std::chrono::milliseconds(2000)});
    const auto start = Clock::now();
    const auto message = message_of<TimeoutError>([&] { work->wait(std::chrono::seconds(60)); });
    rank0_done.store(true);
    EXPECT_LT(since(start), std::chrono::seconds(15));
    expect_contains(message, "[rank 0/2] allreduce #1 timed out after 2000 ms");
  });
}

} // namespace
} // namespace ddp
