// destroy_process_group() then init_process_group() again, many times in a
// row on one MASTER_PORT (env://, so rank 0 serves a TCPStore there), with
// real processes: no round may trip over what the previous one left (rank
// 0's store server, its clients' connections, a rank still leaving the old
// rendezvous). Each round checks a collective; one test also destroys right
// after init, with no collective that would hold the ranks together.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <ddp/init.h>

#include "testing/multi_rank.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ddp::testing::run_processes;

constexpr int kRounds = 20;
constexpr int kAllRoundsPassed = 10;

void set_env(int rank, int world_size, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

// `rounds` of init, [allreduce], destroy. Ranks other than 0 are given
// different head starts each round, so that every order of destroy and
// init across ranks gets its turn. Returns kAllRoundsPassed, or the round
// that failed + 100.
int reinit_rounds(int rank, int world_size, int port, int rounds, bool with_collective) {
  set_env(rank, world_size, port);
  for (int round = 0; round < rounds; ++round) {
    try {
      auto group = init_process_group(InitOptions().backend(Backend::kGloo).timeout(20s));
      if (with_collective) {
        auto t = torch::full({7}, static_cast<double>(rank + 1 + round));
        group->allreduce(t)->wait();
        // Sum over ranks of (r + 1 + round) = W(W+1)/2 + W * round.
        const double expected = world_size * (world_size + 1) / 2.0 + world_size * round;
        if (!torch::equal(t, torch::full({7}, expected))) {
          std::fprintf(stderr, "rank %d round %d: allreduce gave %f, expected %f\n", rank, round,
                       t[0].item<double>(), expected);
          return 100 + round;
        }
      }
      group.reset();
      destroy_process_group();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d round %d: %s\n", rank, round, e.what());
      return 100 + round;
    }
    // Rank 0 late in some rounds, early in others.
    if ((round + rank) % 3 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * (rank + 1)));
    }
  }
  return kAllRoundsPassed;
}

void expect_all_rounds_pass(int world_size, int rounds, bool with_collective) {
  const int port = ddp::testing::free_port();
  ASSERT_GT(port, 0);
  const auto results = run_processes(
      world_size,
      [&](int rank, std::shared_ptr<Store>) -> int {
        return reinit_rounds(rank, world_size, port, rounds, with_collective);
      },
      120s);
  for (int r = 0; r < world_size; ++r) {
    EXPECT_EQ(results[r].exit_code, kAllRoundsPassed)
        << "rank " << r << (results[r].timed_out ? " (timed out)" : "") << ":\n"
        << results[r].output;
  }
}

class GlooReinit : public ::testing::TestWithParam<int> {};

TEST_P(GlooReinit, DestroyThenInitOnTheSamePortTwentyTimes) {
  expect_all_rounds_pass(GetParam(), kRounds, /*with_collective=*/true);
}

// Rank 0 may leave the rendezvous, destroy and serve the next round's store
// while another rank is still reading the old rendezvous's keys.
TEST_P(GlooReinit, DestroyRightAfterInitWithoutACollective) {
  expect_all_rounds_pass(GetParam(), kRounds / 2, /*with_collective=*/false);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooReinit, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_ranks";
                         });

} // namespace
} // namespace ddp
