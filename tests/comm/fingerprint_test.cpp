// The pure parts of the collective fingerprint checks (Note [Collective
// fingerprints], Note [NCCL fingerprint check]), on the CPU: the hash
// check's verdict, and how a difference is explained through the store
// (explain_hash_difference), with ranks as FingerprintExchanges over one
// HashStore. The NCCL check itself needs two GPUs:
// tests/gpu/nccl_fingerprint_test.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ddp/comm/error.h>
#include <ddp/store/hash_store.h>

#include "comm/fingerprint.h"

namespace ddp::internal {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Fingerprint allreduce(int64_t numel, uint64_t seq = 4, at::ScalarType dtype = at::kFloat,
                      ReduceOp op = ReduceOp::kSum) {
  Fingerprint f{"allreduce", dtype, numel, op};
  f.seq = seq;
  return f;
}

// What the NCCL and MPI checks compute: the MAX-allreduce of every rank's
// (h, -h).
std::pair<int64_t, int64_t> max_of_pairs(const std::vector<Fingerprint>& ranks) {
  int64_t largest = std::numeric_limits<int64_t>::min();
  int64_t negated_smallest = std::numeric_limits<int64_t>::min();
  for (const auto& f : ranks) {
    largest = std::max(largest, f.hash63());
    negated_smallest = std::max(negated_smallest, -f.hash63());
  }
  return {largest, negated_smallest};
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "expected '" << part << "' in: " << text;
}

TEST(FingerprintCheck, EqualCallsAgree) {
  for (int world : {1, 2, 5}) {
    const auto [largest, negated_smallest] =
        max_of_pairs(std::vector<Fingerprint>(static_cast<size_t>(world), allreduce(1000)));
    EXPECT_TRUE(hashes_agree(largest, negated_smallest)) << "world " << world;
  }
}

TEST(FingerprintCheck, EveryKindOfDifferenceDisagrees) {
  Fingerprint broadcast{"broadcast", at::kFloat, 1000, std::nullopt, 0};
  Fingerprint root1{"broadcast", at::kFloat, 1000, std::nullopt, 1};
  const std::vector<std::pair<Fingerprint, Fingerprint>> cases = {
      {allreduce(1000), allreduce(2000)},                                // count
      {allreduce(1000), allreduce(1000, 4, at::kInt)},                   // dtype, same bytes
      {allreduce(1000), allreduce(1000, 4, at::kFloat, ReduceOp::kMax)}, // reduce op
      {broadcast, root1},                                                // root
      {allreduce(1000), broadcast},                                      // op
      {Fingerprint{"barrier"}, allreduce(1)}, // NCCL's barrier is a 1-element allreduce
  };
  for (const auto& [a, b] : cases) {
    // One rank of three differs, in either position.
    const auto [l1, n1] = max_of_pairs({a, a, b});
    EXPECT_FALSE(hashes_agree(l1, n1)) << a.describe() << " vs " << b.describe();
    const auto [l2, n2] = max_of_pairs({b, a, a});
    EXPECT_FALSE(hashes_agree(l2, n2)) << a.describe() << " vs " << b.describe();
  }
}

TEST(FingerprintCheck, TheSequenceNumberIsNotHashed) {
  // Ranks compare the calls at one sequence number; the number itself is
  // the group's and equal on every rank.
  EXPECT_EQ(allreduce(1000, 4).hash63(), allreduce(1000, 9).hash63());
  EXPECT_GE(allreduce(1000).hash63(), 0); // so that -h never overflows
}

TEST(ExplainHashDifference, NamesThePeerThatPublishedADifferentCall) {
  auto store = std::make_shared<HashStore>();
  FingerprintExchange rank0(store, "fp/", 0, 2);
  FingerprintExchange rank1(store, "fp/", 1, 2);
  ASSERT_FALSE(rank1.publish_and_compare(allreduce(2000)).has_value()); // rank 0 not there yet

  const auto start = Clock::now();
  const std::string message = explain_hash_difference(rank0, allreduce(1000), 5000ms, 10ms);
  EXPECT_LT(Clock::now() - start, 2s) << "the peer's key was there: no waiting";
  EXPECT_EQ(message, "rank 1 called allreduce #4 with float32[2000] SUM, this rank float32[1000] SUM");

  // And the other side, which published first, now finds rank 0's.
  EXPECT_EQ(explain_hash_difference(rank1, allreduce(2000), 5000ms, 10ms),
            "rank 0 called allreduce #4 with float32[1000] SUM, this rank float32[2000] SUM");
}

TEST(ExplainHashDifference, NamesBothOpsWhenTheyDiffer) {
  auto store = std::make_shared<HashStore>();
  FingerprintExchange rank0(store, "fp/", 0, 2);
  FingerprintExchange rank1(store, "fp/", 1, 2);
  Fingerprint broadcast{"broadcast", at::kFloat, 1000, std::nullopt, 0};
  broadcast.seq = 4;
  rank1.publish_and_compare(broadcast);
  EXPECT_EQ(explain_hash_difference(rank0, allreduce(1000), 5000ms, 10ms),
            "rank 1 called broadcast #4 with float32[1000] root 0, this rank allreduce #4 with "
            "float32[1000] SUM");
}

TEST(ExplainHashDifference, WaitsForAPeerThatPublishesLate) {
  // A peer whose collective hangs publishes from its stall check, about a
  // second later.
  auto store = std::make_shared<HashStore>();
  FingerprintExchange rank0(store, "fp/", 0, 2);
  FingerprintExchange rank1(store, "fp/", 1, 2);
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    rank1.publish_and_compare(allreduce(2000));
  });
  const auto start = Clock::now();
  const std::string message = explain_hash_difference(rank0, allreduce(1000), 5000ms, 10ms);
  const auto waited = Clock::now() - start;
  late.join();
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 4s);
  EXPECT_EQ(message, "rank 1 called allreduce #4 with float32[2000] SUM, this rank float32[1000] SUM");
}

TEST(ExplainHashDifference, GivesUpNamingTheRanksThatNeverPublished) {
  auto store = std::make_shared<HashStore>();
  FingerprintExchange rank0(store, "fp/", 0, 3);
  const auto start = Clock::now();
  const std::string message = explain_hash_difference(rank0, allreduce(1000), 200ms, 10ms);
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 3s);
  EXPECT_EQ(message,
            "the ranks' fingerprints differ (allreduce #4 with float32[1000] SUM on this rank); rank(s) "
            "[1, 2] had not published theirs within 200 ms");
  // It published this rank's own, for the peers to find.
  EXPECT_TRUE(store->check({"fp/4/0"}));
}

TEST(ExplainHashDifference, EqualFingerprintsStillReportADifference) {
  // Cannot happen with one build on every rank; the check must still fail.
  auto store = std::make_shared<HashStore>();
  FingerprintExchange rank0(store, "fp/", 0, 2);
  FingerprintExchange rank1(store, "fp/", 1, 2);
  rank1.publish_and_compare(allreduce(1000));
  const auto start = Clock::now();
  EXPECT_EQ(explain_hash_difference(rank0, allreduce(1000), 5000ms, 10ms),
            "the ranks' fingerprints differ (allreduce #4 with float32[1000] SUM on this rank)");
  EXPECT_LT(Clock::now() - start, 2s) << "every rank had published: no waiting";
}

// netem_cases' link down, four ranks: rank 3 never reached #105's
// publication (its store was across the dead link); rank 1 got through
// #105 without stalling and stalled in #106; rank 2 stalled in #104 and
// published nothing since. Rank 0, timing out in #105, names only rank 3
// as absent, and rank 2 as still in #104.
TEST(RanksMissing, TellsRanksPastTheCollectiveAndRanksBehindFromTheUnseen) {
  auto store = std::make_shared<HashStore>();
  FingerprintExchange rank0(store, "fp/", 0, 4);
  FingerprintExchange rank1(store, "fp/", 1, 4);
  FingerprintExchange rank2(store, "fp/", 2, 4);
  rank0.publish_and_compare(allreduce(1000, 105));
  rank1.publish_and_compare(allreduce(1000, 106));
  Fingerprint broadcast{"broadcast", at::kFloat, 10, std::nullopt, 0};
  broadcast.seq = 104;
  rank2.publish_and_compare(broadcast);
  const Absentees absent = rank0.ranks_missing(105);
  EXPECT_EQ(absent.unseen, std::vector<int>{3});
  ASSERT_EQ(absent.behind.size(), 1u);
  EXPECT_EQ(absent.behind[0].first, 2);
  EXPECT_EQ(absent.behind[0].second, "broadcast #104");
  EXPECT_EQ(absent.clause("allreduce", 105),
            "; rank(s) [3] had not reached allreduce #105; rank 2 was still in broadcast #104");
  // From rank 1's side at #106: rank 0 still in #105, rank 2 in #104.
  const Absentees from1 = rank1.ranks_missing(106);
  EXPECT_EQ(from1.unseen, std::vector<int>{3});
  ASSERT_EQ(from1.behind.size(), 2u);
  EXPECT_EQ(from1.clause("allreduce", 106, " when this rank last read the store"),
            "; rank(s) [3] had not reached allreduce #106 when this rank last read the store; rank 0 was still in "
            "allreduce #105, rank 2 in broadcast #104");
  // Four numbers on, #104 is out of sight: rank 2 is unseen.
  EXPECT_EQ(rank0.ranks_missing(108).unseen, (std::vector<int>{2, 3}));
  // What each compare found, kept for when the store has gone: rank 1
  // published after rank 0 and before rank 2.
  const Absentees kept = rank1.ranks_missing_when_last_compared(106);
  EXPECT_EQ(kept.unseen, (std::vector<int>{2, 3}));
  ASSERT_EQ(kept.behind.size(), 1u);
  EXPECT_EQ(kept.behind[0].second, "allreduce #105");
  EXPECT_EQ(rank0.ranks_missing_when_last_compared(105).unseen, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(rank0.ranks_missing_when_last_compared(7).empty());
  EXPECT_EQ(Absentees{}.clause("allreduce", 1), "");
}

// A store whose reads fail, as after its server has gone.
class BrokenStore : public HashStore {
 public:
  bool check(const std::vector<std::string>& keys) override {
    throw IoError("the store's server is gone");
  }
};

TEST(ExplainHashDifference, SaysSoWhenTheStoreFails) {
  FingerprintExchange rank0(std::make_shared<BrokenStore>(), "fp/", 0, 2);
  std::string message;
  EXPECT_NO_THROW(message = explain_hash_difference(rank0, allreduce(1000), 5000ms, 10ms));
  expect_contains(message, "the ranks' fingerprints differ (allreduce #4 with float32[1000] SUM on this rank)");
  expect_contains(message, "the store could not be read to say how: the store's server is gone");
}

} // namespace
} // namespace ddp::internal
