// Collectives of the MPI backend, ranks as processes under mpirun.
//
// Usage (tests/comm/mpi/mpi.cmake registers these):
//   mpirun -np 3 build/tests/process_group_mpi_test --gtest_brief=1
// Every rank runs every test in the same order on one ProcessGroupMPI of
// the whole job; the world size is mpirun's -np (run alone, it is 1). The
// sweep's checks are tests/comm/collective_sweep.h's, shared with every
// backend, here for element count {0, 1, odd, large}.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>
#include <tuple>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_mpi.h>

#include "comm/collective_sweep.h"

namespace ddp {
namespace {

using ddp::testing::sweep_checks;

// The group every test uses, created by the first test that needs it:
// creating a group is a collective, and every rank runs the tests in the
// same order. A deadline short enough that a rank that fails a check and
// moves on makes the others fail within the test's CTest timeout.
ProcessGroup& group() {
  static auto pg = ProcessGroupMPI::create(ProcessGroupMPIOptions().timeout(std::chrono::seconds(60)));
  return *pg;
}

// (check index, element count)
using Case = std::tuple<size_t, int64_t>;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return ddp::testing::sweep_case_name(std::get<0>(info.param), std::get<1>(info.param));
}

std::vector<size_t> check_indices() {
  std::vector<size_t> indices;
  for (size_t i = 0; i < sweep_checks().size(); ++i) {
    indices.push_back(i);
  }
  return indices;
}

class MpiCollectiveSweep : public ::testing::TestWithParam<Case> {};

TEST_P(MpiCollectiveSweep, Check) {
  const auto [check, count] = GetParam();
  sweep_checks()[check].run(group(), count);
}

INSTANTIATE_TEST_SUITE_P(Mpi, MpiCollectiveSweep,
                         ::testing::Combine(::testing::ValuesIn(check_indices()),
                                            ::testing::ValuesIn(ddp::testing::sweep_counts())),
                         case_name);

// ---- Beyond the sweep --------------------------------------------------------------

TEST(Mpi, GroupIsTheWholeJob) {
  auto& pg = group();
  EXPECT_EQ(pg.backend_name(), "mpi");
  // Every rank agrees on the size, and the ranks are 0..W-1 once each.
  auto ranks = torch::zeros({pg.size()}, torch::kLong);
  ranks[pg.rank()] = 1;
  pg.allreduce(ranks)->wait();
  EXPECT_TRUE(torch::equal(ranks, torch::ones({pg.size()}, torch::kLong)));
  EXPECT_NE(ProcessGroupMPI::mpi_version().find("MPI"), std::string::npos)
      << ProcessGroupMPI::mpi_version();
}

TEST(Mpi, RingAllreduceEveryDtypeAndOp) {
  // Large allreduces take ddp's ring (comm/mpi/mpi_ring.h); with the
  // threshold at 0 every allreduce does, for every dtype and op, and sizes
  // that do not split evenly into segments (1 and 7 elements on 2 to 4 ranks).
  auto ring = ProcessGroupMPI::create(ProcessGroupMPIOptions().ring_allreduce_min_bytes(0));
  for (size_t check = 0; check < 2; ++check) { // allreduce, allreduce_coalesced
    for (int64_t count : ddp::testing::sweep_counts()) {
      SCOPED_TRACE(ddp::testing::sweep_case_name(check, count));
      sweep_checks()[check].run(*ring, count);
    }
  }
}

TEST(Mpi, SeveralGroupsRunConcurrently) {
  // A second group over another communicator: its collective and the first
  // group's, issued together, each complete on its own worker thread.
  auto& first = group();
  auto second = ProcessGroupMPI::create();
  auto a = torch::full({1000}, 1.0 * first.rank());
  auto b = torch::full({1000}, 2.0 * first.rank());
  auto work_a = first.allreduce(a);
  auto work_b = second->allreduce(b);
  work_b->wait();
  work_a->wait();
  const double w = first.size();
  EXPECT_TRUE(torch::equal(a, torch::full({1000}, w * (w - 1) / 2)));
  EXPECT_TRUE(torch::equal(b, torch::full({1000}, w * (w - 1))));
}

TEST(Mpi, IssueOrderIsExecutionOrder) {
  // Many operations in flight on the same tensor: each sees the previous
  // one's result, on every rank.
  auto& pg = group();
  auto t = torch::ones({64});
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 20; ++i) {
    works.push_back(pg.allreduce(t, {ReduceOp::kMax}));
    works.push_back(pg.broadcast(t, {i % pg.size()}));
  }
  works.push_back(pg.allreduce(t));
  for (auto& w : works) {
    w->wait();
  }
  EXPECT_TRUE(torch::equal(t, torch::full({64}, 1.0 * pg.size())));
}

TEST(Mpi, WaitWithShortTimeoutThenTheOperationCompletes) {
  // Rank 0 waits 100 ms on a barrier that rank 1 joins 500 ms late: the wait
  // raises the named TimeoutError, and the barrier then completes anyway.
  auto& pg = group();
  if (pg.size() < 2) {
    pg.barrier()->wait();
    return;
  }
  if (pg.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  auto work = pg.barrier();
  if (pg.rank() == 0) {
    try {
      work->wait(std::chrono::milliseconds(100));
      ADD_FAILURE() << "expected TimeoutError";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("barrier #"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("wait timed out after 100 ms"), std::string::npos)
          << e.what();
    }
  }
  work->wait();
  EXPECT_TRUE(work->is_success());
}

TEST(Mpi, SendRecvAcrossTagsAndDtypes) {
  auto& pg = group();
  if (pg.size() < 2) {
    return;
  }
  // Rank 0 sends two messages with different tags; rank 1 receives them in
  // the opposite order: tags, not order, match them.
  if (pg.rank() == 0) {
    auto a = torch::full({5}, 3.0, torch::kBFloat16);
    auto b = torch::arange(4, torch::kLong);
    auto sa = pg.send(a, 1, {11});
    auto sb = pg.send(b, 1, {12});
    sa->wait();
    sb->wait();
  } else if (pg.rank() == 1) {
    auto a = torch::empty({5}, torch::kBFloat16);
    auto b = torch::empty({4}, torch::kLong);
    auto rb = pg.recv(b, 0, {12});
    auto ra = pg.recv(a, 0, {11});
    rb->wait();
    ra->wait();
    EXPECT_TRUE(torch::equal(a, torch::full({5}, 3.0, torch::kBFloat16)));
    EXPECT_TRUE(torch::equal(b, torch::arange(4, torch::kLong)));
  }
  pg.barrier()->wait();
}

TEST(MpiErrors, BadArgumentsAreClearErrors) {
  ddp::testing::check_bad_arguments_are_clear_errors(group());
}

TEST(MpiErrors, MessagesNameRankAndOperation) {
  ddp::testing::check_messages_name_rank_and_operation(group());
  try {
    group().send(torch::ones({1}), (group().rank() + 1) % group().size(), {-1});
    ADD_FAILURE() << "expected a c10::Error for tag -1";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("send: "), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace ddp
