// `ddprun --analyze`'s "first failure" line (src/launch/readers/analyzer.cpp)
// from dumps written here by hand: the ranks' errors alone (the store's
// record of the first failure, or else the one rank their "lost connection"
// arrows end at), and ddprun's account (launcher.json) beside them.

#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "launch/readers/analyzer.h"
#include "launch/readers/launcher_account.h"

namespace ddp::flight_recorder {
namespace {

class FirstFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/ddp-first-failure.XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override {
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  // Rank `rank` of 4 failed in allreduce #9 with `error` (empty: it
  // completed #9).
  void dump(int rank, const std::string& error) {
    const std::string state = error.empty() ? "completed" : "failed";
    std::ofstream(dir_ + "/rank_" + std::to_string(rank) + ".json")
        << R"({"schema": "ddp-flight-recorder", "version": 1, "rank": )" << rank
        << R"(, "job": "j", "world_size": 4, "dumped_at_us": 1, "reason": "r", "groups": [{"name": "default", )"
        << R"("backend": "gloo", "rank": )" << rank << R"(, "size": 4, "entries": [{"seq": 9, "op": "allreduce", )"
        << R"("shape": "float32[4] SUM", "state": ")" << state << R"(", "error": ")" << error << R"("}]}]})";
  }

  // What the analyzer prints as the first failure ("" when nothing).
  std::string first_failure() {
    std::FILE* out = std::tmpfile();
    std::FILE* err = std::tmpfile();
    EXPECT_EQ(analyze_directory(dir_, out, err), 0);
    std::rewind(out);
    std::string text;
    char line[4096];
    while (std::fgets(line, sizeof line, out) != nullptr) {
      const std::string s = line;
      if (s.rfind("  first failure: ", 0) == 0) {
        text = s.substr(17, s.size() - 18);
      }
    }
    std::fclose(out);
    std::fclose(err);
    return text;
  }

  // ddprun's account of job `job`: rank `rank` `what` first.
  void account(const std::string& job, int rank, const std::string& what) {
    LauncherAccount account;
    account.job = job;
    account.world_size = 4;
    account.first_failed = rank;
    account.what = what;
    std::string error;
    ASSERT_TRUE(write_launcher_account(dir_, account, &error)) << error;
  }

  static std::string lost(int peer) {
    return "allreduce #9: lost connection to rank " + std::to_string(peer) + " (this is rank x); the peer exited";
  }

  std::string dir_;
};

TEST_F(FirstFailure, FollowsTheLostConnectionsToTheRankThatBlamesNobody) {
  // Rank 3 left no dump; 2 and 0 lost it, 1 lost 0 (which left after it).
  dump(0, lost(3));
  dump(1, lost(0));
  dump(2, lost(3));
  EXPECT_EQ(first_failure(), "rank 3 (as the ranks' errors say)");
}

TEST_F(FirstFailure, ARankThatFailedOnItsOwnAndDumpedIsTheEndOfTheArrows) {
  dump(0, lost(1));
  dump(1, ""); // it gave up outside any collective, after dumping
  dump(2, lost(1));
  dump(3, lost(0));
  EXPECT_EQ(first_failure(), "rank 1 (as the ranks' errors say)");
}

TEST_F(FirstFailure, TheStoresRecordComesBeforeTheArrows) {
  dump(0, lost(1));
  dump(1, lost(2) + "; rank 3 failed first (rank 2 lost its connection to it in allreduce #9)");
  dump(2, lost(1));
  EXPECT_EQ(first_failure(), "rank 3 (as the ranks' errors say)");
}

TEST_F(FirstFailure, NothingWhenTheArrowsEndAtTwoRanks) {
  dump(0, lost(1));
  dump(2, lost(3));
  EXPECT_EQ(first_failure(), "");
}

TEST_F(FirstFailure, DdprunsAccountOfAKilledRankComesFirst) {
  dump(0, lost(1));
  dump(1, lost(2));
  dump(2, lost(1));
  account("j", 3, "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(first_failure(), "rank 3 (ddprun saw it: it was killed by signal 9 (SIGKILL))");
}

TEST_F(FirstFailure, ARankThatOnlyExitedFirstGivesWayToTheErrors) {
  dump(0, lost(1));
  dump(2, lost(1));
  dump(3, lost(0));
  account("j", 2, "exited with code 1");
  EXPECT_EQ(first_failure(), "rank 1 (as the ranks' errors say; ddprun saw rank 2 end first: it exited with code 1)");
}

TEST_F(FirstFailure, AnotherJobsAccountIsIgnored) {
  dump(0, lost(3));
  dump(1, lost(0));
  dump(2, lost(3));
  account("another", 1, "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(first_failure(), "rank 3 (as the ranks' errors say)");
}

} // namespace
} // namespace ddp::flight_recorder
