// The owner of each parameter of a ZeroRedundancyOptimizer
// (partition_parameters): PyTorch's greedy rule, worked by hand, and its
// invariants over generated cases.

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <ddp/optim/zero_redundancy_optimizer.h>

namespace {

using ddp::optim::partition_parameters;
using Owners = std::vector<std::vector<int>>;

TEST(ZeroPartition, WorkedExampleOfTheSource) {
  // Largest first: 10 (index 1) to rank 0, 10 (index 3) to rank 1, 6 to
  // rank 0 (10, 10: the lower rank), 4 to rank 1 (16, 10).
  EXPECT_EQ(partition_parameters({{4, 10, 6, 10}}, 2), (Owners{{1, 0, 0, 1}}));
}

TEST(ZeroPartition, TotalsCarryOverToTheNextGroup) {
  // Group 0 leaves totals 5, 3, 0 (3 ranks); group 1's 4 goes to rank 2
  // (total 4), its 2 to rank 1 (3 < 4 < 5), its 1 to rank 2 (5, 5, 4).
  EXPECT_EQ(partition_parameters({{5, 3}, {1, 4, 2}}, 3), (Owners{{0, 1}, {2, 2, 1}}));
}

TEST(ZeroPartition, EqualCountsKeepTheirOrder) {
  // A stable sort: equal counts are taken in their order, round robin.
  EXPECT_EQ(partition_parameters({{7, 7, 7, 7, 7}}, 3), (Owners{{0, 1, 2, 0, 1}}));
}

TEST(ZeroPartition, OneRankOwnsEverything) {
  EXPECT_EQ(partition_parameters({{3, 1}, {}, {9}}, 1), (Owners{{0, 0}, {}, {0}}));
}

TEST(ZeroPartition, MoreRanksThanParameters) {
  // Ranks 2 and 3 own nothing; empty tensors go to the smallest total.
  EXPECT_EQ(partition_parameters({{8, 0}}, 4), (Owners{{0, 1}}));
}

TEST(ZeroPartition, GeneratedCasesFollowTheRule) {
  // Invariants of the greedy rule: at each assignment, the chosen rank had
  // the smallest total (lowest on ties), in largest-first order per group.
  std::mt19937 random(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + static_cast<int>(random() % 5);
    std::vector<std::vector<int64_t>> numels(1 + random() % 3);
    for (auto& group : numels) {
      group.resize(random() % 9);
      for (auto& n : group) {
        n = static_cast<int64_t>(random() % 50);
      }
    }
    const auto owners = partition_parameters(numels, world);
    ASSERT_EQ(owners.size(), numels.size());
    std::vector<int64_t> totals(static_cast<size_t>(world), 0);
    for (size_t g = 0; g < numels.size(); ++g) {
      ASSERT_EQ(owners[g].size(), numels[g].size());
      std::vector<size_t> order(numels[g].size());
      for (size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return numels[g][a] > numels[g][b]; });
      for (const size_t i : order) {
        const int owner = owners[g][i];
        ASSERT_GE(owner, 0);
        ASSERT_LT(owner, world);
        for (int r = 0; r < world; ++r) {
          // No rank had a smaller total, and none below it an equal one.
          ASSERT_TRUE(totals[static_cast<size_t>(r)] > totals[static_cast<size_t>(owner)] ||
                      (totals[static_cast<size_t>(r)] == totals[static_cast<size_t>(owner)] && r >= owner))
              << "trial " << trial << ", group " << g << ", parameter " << i;
        }
        totals[static_cast<size_t>(owner)] += numels[g][i];
      }
    }
  }
}

TEST(ZeroPartition, BadArguments) {
  EXPECT_THROW(partition_parameters({{1}}, 0), c10::Error);
  try {
    partition_parameters({{1, -2}}, 2);
    FAIL() << "no error for a negative count";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1 of group 0 has a negative element count (-2)"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
