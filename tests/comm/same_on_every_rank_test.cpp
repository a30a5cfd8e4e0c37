// The message of the one check that every rank built the same thing
// (src/comm/objects/same_on_every_rank.h), which DistributedDataParallel,
// ZeroRedundancyOptimizer and FullyShardedDataParallel share; the check
// itself runs on 2 ranks in ddp_errors_main, zero_main and fsdp_main.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/objects/same_on_every_rank.h"

namespace ddp::internal {
namespace {

const SameOnEveryRank kWords{"[rank 2/3] Thing", "the model differs across ranks", "parameter",
                             "Build the same model on every rank."};

TEST(SameOnEveryRank, EqualDescriptionsSayNothing) {
  EXPECT_EQ(difference_message({{"a", "b"}, {"a", "b"}, {"a", "b"}}, kWords), "");
  EXPECT_EQ(difference_message({{}, {}}, kWords), "");
}

TEST(SameOnEveryRank, NamesEveryDifferingRankAndTheFirstDifferingLine) {
  EXPECT_EQ(difference_message({{"'w' [16, 8]", "'b' [16]"}, {"'w' [16, 8]", "'b' [17]"}, {"'w' [15, 8]", "'b' [16]"}},
                               kWords),
            "[rank 2/3] Thing: the model differs across ranks: rank(s) [1, 2] differ from rank 0; first, parameter 1 "
            "is 'b' [17] on rank 1 but 'b' [16] on rank 0. Build the same model on every rank.");
}

TEST(SameOnEveryRank, SaysWhichRankHasTheLineTheOtherLacks) {
  EXPECT_EQ(difference_message({{"x", "y"}, {"x"}}, kWords),
            "[rank 2/3] Thing: the model differs across ranks: rank(s) [1] differ from rank 0; first, rank 1 has 1 "
            "parameter and rank 0 has 2 parameters (parameter 1 is y on rank 0 only). Build the same model on every "
            "rank.");
  EXPECT_EQ(difference_message({{}, {"x"}}, kWords),
            "[rank 2/3] Thing: the model differs across ranks: rank(s) [1] differ from rank 0; first, rank 1 has 1 "
            "parameter and rank 0 has 0 parameters (parameter 0 is x on rank 1 only). Build the same model on every "
            "rank.");
}

} // namespace
} // namespace ddp::internal
