// Collectives of the Gloo backend, ranks as threads over a HashStore.
//
// Sweep: world size {1, 2, 3, 4} x element count {0, 1, odd, large}; inside
// each case every dtype and every reduce op that makes sense for it. Expected
// values are in closed form: rank r contributes r + (i % 5) at element i, so
// SUM = W(W-1)/2 + W(i % 5), and so on.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_gloo.h>

#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp::testing::make_gloo_group;
using ddp::testing::run_threads;

struct Case {
  int world;
  int64_t count;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "W" + std::to_string(info.param.world) + "_N" + std::to_string(info.param.count);
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (int world : {1, 2, 3, 4}) {
    // 0, 1, odd, and large: past Gloo's 1 MiB segment for 4-byte types.
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{(1 << 18) + 3}}) {
      cases.push_back({world, count});
    }
  }
  return cases;
}

const std::vector<at::ScalarType> kFloating = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
const std::vector<at::ScalarType> kIntegral = {at::kChar, at::kByte, at::kShort, at::kInt, at::kLong};

at::Tensor pattern(int64_t count) {
  return torch::arange(count, torch::kLong).remainder(5);
}

// Rank r's input for `op` and the closed-form result, as Long/Double.
std::pair<at::Tensor, at::Tensor> input_and_expected(ReduceOp op, int rank, int world,
                                                     int64_t count, at::ScalarType dtype) {
  const auto p = pattern(count);
  const int64_t w = world;
  if (dtype == at::kBool) {
    // Rank 0 holds true, every other rank false.
    auto input = torch::full({count}, rank == 0, torch::kBool);
    bool expected = false;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
      case ReduceOp::kBxor:
        expected = true;
        break;
      default: // PRODUCT, MIN, BAND: true only if every rank holds true
        expected = world == 1;
    }
    return {input, torch::full({count}, expected, torch::kBool)};
  }
  switch (op) {
    case ReduceOp::kSum:
      return {p + rank, p * w + w * (w - 1) / 2};
    case ReduceOp::kAvg:
      return {p + rank, p.to(torch::kDouble) + (w - 1) / 2.0};
    case ReduceOp::kMin:
      return {p + rank, p};
    case ReduceOp::kMax:
      return {p + rank, p + (w - 1)};
    case ReduceOp::kProduct: {
      int64_t factorial = 1;
      for (int64_t k = 2; k <= w; ++k) {
        factorial *= k;
      }
      return {torch::full({count}, rank + 1, torch::kLong), torch::full({count}, factorial, torch::kLong)};
    }
    case ReduceOp::kBand:
      return {torch::full({count}, int64_t{1} << rank, torch::kLong),
              torch::full({count}, w == 1 ? 1 : 0, torch::kLong)};
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return {torch::full({count}, int64_t{1} << rank, torch::kLong),
              torch::full({count}, (int64_t{1} << w) - 1, torch::kLong)};
  }
  return {};
}

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) {
    return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  }
  return {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
}

std::vector<at::ScalarType> all_dtypes() {
  std::vector<at::ScalarType> dtypes(kFloating);
  dtypes.insert(dtypes.end(), kIntegral.begin(), kIntegral.end());
  dtypes.push_back(at::kBool);
  return dtypes;
}

class CollectiveSweep : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveSweep, AllreduceEveryDtypeAndOp) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    for (auto dtype : all_dtypes()) {
      for (auto op : ops_for(dtype)) {
        auto [input, expected] = input_and_expected(op, rank, world, count, dtype);
        auto tensor = input.to(dtype);
        pg->allreduce(tensor, {op})->wait();
        ASSERT_TRUE(torch::equal(tensor, expected.to(dtype)))
            << "rank " << rank << " dtype " << dtype << " op " << to_string(op);
      }
    }
  });
}

TEST_P(CollectiveSweep, AllreduceCoalescedMatchesSeparateSums) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    auto a = torch::full({count}, rank + 1.0);
    auto b = torch::full({2, 3}, 2.0 * rank);
    pg->allreduce_coalesced({a, b})->wait();
    EXPECT_TRUE(torch::equal(a, torch::full({count}, world * (world + 1) / 2.0)));
    EXPECT_TRUE(torch::equal(b, torch::full({2, 3}, 1.0 * world * (world - 1))));
  });
}

TEST_P(CollectiveSweep, BroadcastFromEveryRoot) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    for (int root = 0; root < world; ++root) {
      for (auto dtype : {at::kFloat, at::kHalf, at::kLong, at::kBool}) {
        auto tensor = (pattern(count) + 10 * rank).to(dtype);
        pg->broadcast(tensor, {root})->wait();
        ASSERT_TRUE(torch::equal(tensor, (pattern(count) + 10 * root).to(dtype)))
            << "root " << root << " dtype " << dtype;
      }
    }
  });
}

TEST_P(CollectiveSweep, ReduceToEveryRoot) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    for (int root = 0; root < world; ++root) {
      auto tensor = (pattern(count) + rank).to(torch::kFloat);
      pg->reduce(tensor, {ReduceOp::kSum, root})->wait();
      if (rank == root) {
        ASSERT_TRUE(torch::equal(tensor, (pattern(count) * world + world * (world - 1) / 2).to(torch::kFloat)));
      }
    }
  });
}

TEST_P(CollectiveSweep, AllgatherBothForms) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    auto input = (pattern(count) + 100 * rank).to(torch::kInt);
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) {
      outputs.push_back(torch::empty({count}, torch::kInt));
    }
    pg->allgather(outputs, input)->wait();
    auto flat = torch::empty({world * count}, torch::kInt);
    pg->allgather_into_tensor(flat, input)->wait();
    for (int r = 0; r < world; ++r) {
      auto expected = (pattern(count) + 100 * r).to(torch::kInt);
      ASSERT_TRUE(torch::equal(outputs[r], expected)) << "from rank " << r;
      ASSERT_TRUE(torch::equal(flat.narrow(0, r * count, count), expected)) << "from rank " << r;
    }
  });
}

TEST_P(CollectiveSweep, GatherAndScatter) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    const int root = world - 1;
    std::vector<at::Tensor> gathered;
    if (rank == root) {
      for (int r = 0; r < world; ++r) {
        gathered.push_back(torch::empty({count}, torch::kDouble));
      }
    }
    pg->gather(gathered, torch::full({count}, rank * 1.5, torch::kDouble), {root})->wait();
    for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
      ASSERT_TRUE(torch::equal(gathered[r], torch::full({count}, r * 1.5, torch::kDouble)));
    }

    std::vector<at::Tensor> pieces;
    if (rank == root) {
      for (int r = 0; r < world; ++r) {
        pieces.push_back(pattern(count) * (r + 1));
      }
    }
    auto mine = torch::empty({count}, torch::kLong);
    pg->scatter(mine, pieces, {root})->wait();
    ASSERT_TRUE(torch::equal(mine, pattern(count) * (rank + 1)));
  });
}

TEST_P(CollectiveSweep, ReduceScatterAndAlltoall) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back(torch::full({count}, 1.0f * (r + 1) * (rank + 1)));
    }
    auto output = torch::empty({count});
    pg->reduce_scatter(output, inputs)->wait();
    // sum over ranks q of (rank+1)(q+1) = (rank+1) W(W+1)/2
    ASSERT_TRUE(torch::equal(output, torch::full({count}, (rank + 1.0f) * world * (world + 1) / 2)));

    // Chunk c of rank r's input holds 10r + c; after alltoall, chunk c of
    // this rank's output holds 10c + rank.
    auto input = torch::empty({world * count}, torch::kLong);
    for (int c = 0; c < world; ++c) {
      input.narrow(0, c * count, count).fill_(10 * rank + c);
    }
    auto received = torch::empty({world * count}, torch::kLong);
    pg->alltoall(received, input)->wait();
    for (int c = 0; c < world; ++c) {
      ASSERT_TRUE(torch::equal(received.narrow(0, c * count, count),
                               torch::full({count}, 10 * c + rank, torch::kLong)));
    }
  });
}

TEST_P(CollectiveSweep, SendRecvRingAndBarrier) {
  const auto [world, count] = GetParam();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    if (world == 1) {
      // No peer to talk to: sending to oneself is an error, not a hang.
      EXPECT_THROW(pg->send(torch::ones({count}), 0), c10::Error);
      pg->barrier()->wait();
      return;
    }
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;
    auto out = torch::full({count}, 1.0 * rank);
    auto in = torch::empty({count});
    auto sent = pg->send(out, next, {7});
    auto received = pg->recv(in, prev, {7});
    sent->wait();
    received->wait();
    ASSERT_TRUE(torch::equal(in, torch::full({count}, 1.0 * prev)));
    pg->barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, CollectiveSweep, ::testing::ValuesIn(sweep()), case_name);

// ---- Errors: the exception type and a message substring ---------------------

template <typename Fn>
void expect_check_error(Fn&& fn, const std::string& substring) {
  try {
    fn();
    FAIL() << "expected a c10::Error containing '" << substring << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

TEST(GlooErrors, BadArgumentsAreClearErrors) {
  run_threads(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2);
    auto strided = torch::ones({4, 4}).t();
    expect_check_error([&] { pg->allreduce(strided); }, "allreduce: tensor must be contiguous");
    expect_check_error([&] { pg->allreduce(torch::ones({3}, torch::kInt), {ReduceOp::kAvg}); },
                       "AVG is not defined for dtype Int");
    expect_check_error([&] { pg->allreduce(torch::ones({3}), {ReduceOp::kBxor}); },
                       "BXOR is not defined for dtype Float");
    expect_check_error([&] { pg->allreduce_coalesced({torch::ones({3}), torch::ones({3}, torch::kDouble)}); },
                       "tensors[1] has dtype Double, expected Float");
    expect_check_error([&] { pg->broadcast(torch::ones({3}), {5}); }, "root rank 5 is out of range for world size 2");
    expect_check_error([&] { pg->allgather({torch::ones({3})}, torch::ones({3})); },
                       "outputs holds 1 tensors, expected one per rank (2)");
    expect_check_error([&] { pg->allgather({torch::ones({3}), torch::ones({4})}, torch::ones({3})); },
                       "outputs[1] has 4 elements");
    expect_check_error([&] { pg->send(torch::ones({3}), rank); }, "destination rank");
    expect_check_error([&] { pg->alltoall(torch::ones({3}), torch::ones({3})); },
                       "does not split into 2 equal chunks");
    expect_check_error([&] { pg->allreduce(torch::ones({3}), {ReduceOp::kSum, std::chrono::milliseconds(0)}); },
                       "timeout must be positive");
    // The group is still usable after argument errors: nothing was queued.
    auto t = torch::ones({2});
    pg->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t, torch::full({2}, 2.0)));
  });
}

TEST(GlooErrors, MessagesNameRankAndOperation) {
  run_threads(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2);
    expect_check_error([&] { pg->allreduce(torch::ones({3}, torch::kComplexFloat)); },
                       "[rank " + std::to_string(rank) + "/2] allreduce: tensor has dtype ComplexFloat");
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
