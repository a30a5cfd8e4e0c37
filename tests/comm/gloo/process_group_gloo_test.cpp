// Collectives of the Gloo backend, ranks as threads over a HashStore.
//
// The sweep's checks are tests/comm/collective_sweep.h's, shared with every
// backend; here they run for world size {1, 2, 3, 4} x element count {0, 1,
// odd, large}, each case on its own Gloo group.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_gloo.h>

#include "comm/collective_sweep.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp::testing::make_gloo_group;
using ddp::testing::run_threads;
using ddp::testing::sweep_checks;

// (check index, world size, element count)
using Case = std::tuple<size_t, int, int64_t>;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [check, world, count] = info.param;
  return ddp::testing::sweep_case_name(check, count) + "_W" + std::to_string(world);
}

std::vector<size_t> check_indices() {
  std::vector<size_t> indices;
  for (size_t i = 0; i < sweep_checks().size(); ++i) {
    indices.push_back(i);
  }
  return indices;
}

class GlooCollectiveSweep : public ::testing::TestWithParam<Case> {};

TEST_P(GlooCollectiveSweep, Check) {
  const auto [check, world, count] = GetParam();
  run_threads(world, [&, check = check, world = world, count = count](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    sweep_checks()[check].run(*pg, count);
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooCollectiveSweep,
                         ::testing::Combine(::testing::ValuesIn(check_indices()),
                                            ::testing::Values(1, 2, 3, 4),
                                            ::testing::ValuesIn(ddp::testing::sweep_counts())),
                         case_name);

// ---- Errors: the exception type and a message substring ---------------------

TEST(GlooErrors, BadArgumentsAreClearErrors) {
  for (int world : {2, 3}) {
    run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
      auto pg = make_gloo_group(store, rank, world);
      ddp::testing::check_bad_arguments_are_clear_errors(*pg);
    });
  }
}

TEST(GlooErrors, MessagesNameRankAndOperation) {
  run_threads(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2);
    ddp::testing::check_messages_name_rank_and_operation(*pg);
  });
}

TEST(Work, ThenChainsResultsAndErrors) {
  auto work = Work::create("test work");
  auto doubled = work->then([](const std::vector<at::Tensor>& r) {
    return std::vector<at::Tensor>{r[0] * 2};
  });
  EXPECT_FALSE(doubled->is_completed());
  work->set_result({torch::ones({2})});
  doubled->wait();
  EXPECT_TRUE(torch::equal(doubled->result()[0], torch::full({2}, 2.0)));

  auto failing = Work::create("failing work");
  auto after = failing->then([](const std::vector<at::Tensor>& r) { return r; });
  failing->set_error(std::make_exception_ptr(IoError("boom")));
  EXPECT_THROW(after->wait(), IoError);
  EXPECT_FALSE(after->is_success());
}

TEST(Work, WaitTimesOutWithTheOperationName) {
  auto work = Work::create("[rank 0/2] allreduce #3");
  try {
    work->wait(std::chrono::milliseconds(50));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("[rank 0/2] allreduce #3: wait timed out after 50 ms"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace ddp
