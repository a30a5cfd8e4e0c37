// Ranks that call different collectives at the same point (Note [Collective
// fingerprints]), with real processes and real Gloo sockets: every rank must
// raise CollectiveMismatchError naming both calls, promptly, and no rank may
// crash (a size mismatch used to abort inside Gloo) or return a partly
// reduced tensor.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <thread>

#include <ddp/comm/error.h>

#include "testing/mismatch_case.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ddp::testing::make_gloo_group;
using ddp::testing::run_processes;
using ddp::testing::MismatchCase;

using namespace ddp::testing; // the exit codes (testing/mismatch_case.h)

class GlooMismatch : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(GlooMismatch, IsAnErrorNamingBothCallsOnEveryRank) {
  const MismatchCase c = GetParam();
  const auto results = run_processes(
      2,
      [&c](int rank, std::shared_ptr<Store> store) -> int {
        torch::set_num_threads(1);
        auto pg = make_gloo_group(store, rank, 2, 20s);
        // Long before the 20 s deadline: the monitor looks after 1 s.
        return run_mismatch_case(*pg, c, rank, torch::ones({16}), 8s, 20s);
      },
      60s);
  for (int rank = 0; rank < 2; ++rank) {
    std::fprintf(stderr, "rank %d: %s", rank, results[rank].output.c_str()); // for ctest -V
    EXPECT_EQ(results[rank].signal, 0) << "rank " << rank << " crashed:\n" << results[rank].output;
    EXPECT_FALSE(results[rank].timed_out) << "rank " << rank << ":\n" << results[rank].output;
    EXPECT_EQ(results[rank].exit_code, kSawExpected) << "rank " << rank << ":\n" << results[rank].output;
  }
}

// Float tensors of `numel` elements filled with ones.
at::Tensor ones(int64_t numel, at::ScalarType dtype = at::kFloat) {
  return torch::ones({numel}, torch::dtype(dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Gloo, GlooMismatch,
    ::testing::Values(
        MismatchCase{"AllreduceCount1000vs2000",
                     [](ProcessGroup& pg, int rank) { return pg.allreduce(ones(rank == 0 ? 1000 : 2000)); },
                     [](int rank) {
                       return c10::str("allreduce #1 with float32[", rank == 0 ? 1000 : 2000, "] SUM");
                     }},
        MismatchCase{"AllreduceCount1Mvs4M",
                     [](ProcessGroup& pg, int rank) {
                       return pg.allreduce(ones(rank == 0 ? (1 << 20) : (4 << 20)));
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with float32[", rank == 0 ? (1 << 20) : (4 << 20),
                                       "] SUM");
                     }},
        MismatchCase{"AllreduceDtypeSameBytes",
                     [](ProcessGroup& pg, int rank) {
                       return pg.allreduce(ones(1000, rank == 0 ? at::kFloat : at::kInt));
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with ", rank == 0 ? "float32" : "int32", "[1000] SUM");
                     }},
        MismatchCase{"AllreduceSumVsMax",
                     [](ProcessGroup& pg, int rank) {
                       AllreduceOptions options;
                       options.op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
                       return pg.allreduce(ones(1000), options);
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with float32[1000] ", rank == 0 ? "SUM" : "MAX");
                     }},
        MismatchCase{"BroadcastRoots",
                     [](ProcessGroup& pg, int rank) {
                       BroadcastOptions options;
                       options.root_rank = rank; // each rank thinks it is the root
                       return pg.broadcast(ones(1000), options);
                     },
                     [](int rank) { return c10::str("broadcast #1 with float32[1000] root ", rank); }},
        MismatchCase{"AllreduceVsBroadcast",
                     [](ProcessGroup& pg, int rank) {
                       return rank == 0 ? pg.allreduce(ones(1000)) : pg.broadcast(ones(1000));
                     },
                     [](int rank) {
                       return rank == 0 ? std::string("allreduce #1 with float32[1000] SUM")
                                        : std::string("broadcast #1 with float32[1000] root 0");
                     }}),
    ddp::testing::mismatch_case_name);

// Three ranks, one of which differs: every rank raises, each naming a rank
// whose call differs from its own (rank 2 names whichever of ranks 0 and 1
// it compared with first).
TEST(GlooMismatch, OneRankOfThreeDiffers) {
  const auto results = run_processes(
      3,
      [](int rank, std::shared_ptr<Store> store) -> int {
        torch::set_num_threads(1);
        auto pg = make_gloo_group(store, rank, 3, 20s);
        auto warmup = torch::ones({16});
        pg->allreduce(warmup)->wait();
        try {
          pg->allreduce(ones(rank == 2 ? 2000 : 1000))->wait();
        } catch (const CollectiveMismatchError& e) {
          const std::string what = e.what();
          std::fprintf(stderr, "%s\n", e.what());
          const std::string others =
              "called allreduce #1 with float32[1000] SUM, this rank float32[2000] SUM";
          const bool names_both =
              rank == 2 ? (what.find("rank 0 " + others) != std::string::npos ||
                           what.find("rank 1 " + others) != std::string::npos)
                        : what.find(c10::str("[rank ", rank, "/3] allreduce #1: rank 2 called allreduce #1 "
                                             "with float32[2000] SUM, this rank float32[1000] SUM")) !=
                              std::string::npos;
          return names_both ? kSawExpected : kSawWrongMessage;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "unexpected error: %s\n", e.what());
          return kSawOtherError;
        }
        return kNoError;
      },
      60s);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].signal, 0) << "rank " << rank << " crashed:\n" << results[rank].output;
    EXPECT_EQ(results[rank].exit_code, kSawExpected) << "rank " << rank << ":\n" << results[rank].output;
  }
}

// A rank that never reaches a collective: the timeout names it.
TEST(GlooMismatch, TimeoutNamesTheRankThatHadNotArrived) {
  const auto results = run_processes(
      2,
      [](int rank, std::shared_ptr<Store> store) -> int {
        torch::set_num_threads(1);
        auto pg = make_gloo_group(store, rank, 2, 20s);
        return run_timeout_names_missing_rank(*pg, rank, torch::ones({16}), 5s, 10s);
      },
      60s);
  EXPECT_EQ(results[0].exit_code, kSawExpected) << results[0].output;
  EXPECT_EQ(results[1].signal, 0) << results[1].output;
}

} // namespace
} // namespace ddp
