// The arrival step of every backend's rendezvous (src/comm/rendezvous_arrival.h):
// ranks as threads over one HashStore. Every rank is released once its world
// has arrived; ranks started with different world sizes are told so at once,
// naming the rank that differs; a rank that never comes is named at the
// deadline.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/error.h>
#include <ddp/store/hash_store.h>

#include "comm/rendezvous_arrival.h"

namespace ddp {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct Outcome {
  std::string error; // empty: released
  milliseconds took{0};
};

// Runs one thread per entry of `sizes` (rank i with world size sizes[i])
// through the arrival step with `timeout`; returns each rank's outcome.
std::vector<Outcome> arrive(const std::vector<int>& sizes, milliseconds timeout) {
  HashStore store(std::chrono::seconds(30));
  std::vector<Outcome> outcomes(sizes.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < sizes.size(); ++r) {
    threads.emplace_back([&, r] {
      const auto start = Clock::now();
      const int rank = static_cast<int>(r);
      const std::string who = "[rank " + std::to_string(rank) + "/" + std::to_string(sizes[r]) + "]";
      try {
        internal::wait_for_all_ranks(store, "test/", rank, sizes[r], timeout, who);
      } catch (const std::exception& e) {
        outcomes[r].error = e.what();
      }
      outcomes[r].took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  return outcomes;
}

TEST(RendezvousArrival, EveryRankIsReleasedOnceTheWorldHasArrived) {
  ::setenv("DDP_RENDEZVOUS_PROGRESS_S", "0", 1);
  for (const int world : {1, 2, 5, 64}) {
    const auto outcomes = arrive(std::vector<int>(world, world), std::chrono::seconds(20));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(outcomes[r].error, "") << "rank " << r << " of " << world;
      EXPECT_LT(outcomes[r].took.count(), 10000) << "rank " << r << " of " << world;
    }
  }
}

TEST(RendezvousArrival, AMissingRankIsNamedAtTheDeadline) {
  ::setenv("DDP_RENDEZVOUS_PROGRESS_S", "0", 1);
  // Ranks 0 and 2 of 3; rank 1 never comes.
  HashStore store(std::chrono::seconds(30));
  std::string error;
  std::thread other([&] {
    try {
      internal::wait_for_all_ranks(store, "test/", 2, 3, milliseconds(1500), "[rank 2/3]");
    } catch (const std::exception&) {
    }
  });
  try {
    internal::wait_for_all_ranks(store, "test/", 0, 3, milliseconds(1500), "[rank 0/3]");
  } catch (const TimeoutError& e) {
    error = e.what();
  }
  other.join();
  EXPECT_NE(error.find("[rank 0/3] init_process_group: rendezvous timed out"), std::string::npos)
      << error;
  EXPECT_NE(error.find("rank(s) [1] of 3 never arrived"), std::string::npos) << error;
}

TEST(RendezvousArrival, AWorldSizeThatDiffersIsNamedWithoutWaitingForTheDeadline) {
  ::setenv("DDP_RENDEZVOUS_PROGRESS_S", "0", 1);
  // Rank 0 says 2 ranks, rank 1 says 3: rank 0's world has arrived, and it
  // must say at once that rank 1 disagrees (not wait its 5 s out). Rank 1
  // waits for a third rank that never comes.
  for (int round = 0; round < 3; ++round) {
    const auto outcomes = arrive({2, 3}, std::chrono::seconds(5));
    const auto& first = outcomes[0];
    EXPECT_NE(first.error.find("[rank 0/2] init_process_group: rank 1 was started with world size "
                               "3, this rank with 2; every rank needs the same WORLD_SIZE"),
              std::string::npos)
        << first.error;
    EXPECT_LT(first.took.count(), 2500) << first.error;
    EXPECT_NE(outcomes[1].error.find("rank(s) [2] of 3 never arrived"), std::string::npos)
        << outcomes[1].error;
  }
}

TEST(RendezvousArrival, ADisagreeingRankBeyondThisWorldIsStillCaught) {
  ::setenv("DDP_RENDEZVOUS_PROGRESS_S", "0", 1);
  // Ranks 0 and 1 say 2 ranks, rank 2 says 3. Ranks 0 and 1 count to 2
  // among whichever two arrive first: when rank 2 is one of them, the vote
  // for 2 falls short and the rank that says 3 is beyond their world (its
  // key is not among theirs): the error says so. Otherwise ranks 0 and 1 are
  // released, as before. Either way no rank waits for its deadline.
  for (int round = 0; round < 10; ++round) {
    const auto outcomes = arrive({2, 2, 3}, std::chrono::seconds(20));
    for (int r = 0; r < 2; ++r) {
      const auto& e = outcomes[r].error;
      EXPECT_TRUE(e.empty() ||
                  e.find("init_process_group: the first 2 ranks to arrive were not all started "
                         "with world size 2 as this rank was: a rank numbered 2 or above arrived "
                         "with another WORLD_SIZE") != std::string::npos)
          << "rank " << r << ": " << e;
      EXPECT_LT(outcomes[r].took.count(), 10000) << e;
    }
    EXPECT_NE(outcomes[2].error.find("was started with world size 2, this rank with 3"),
              std::string::npos)
        << outcomes[2].error;
    EXPECT_LT(outcomes[2].took.count(), 10000) << outcomes[2].error;
  }
}

} // namespace
} // namespace ddp
