// Ranks that call different collectives at the same point on the NCCL
// backend (Note [NCCL fingerprint check]), as real processes with one GPU
// each: every rank must raise CollectiveMismatchError naming both calls
// within a few seconds, and no rank may crash, hang, or count a garbage
// result as a success. Calls of equal byte counts (float32 against int32,
// SUM against MAX, two roots) complete inside NCCL and are caught by the
// check in their own launch; calls of different sizes may hang and are
// caught by the watchdog's stall comparison. Also: matched collectives
// still pass (more of them in flight than one chunk of check slots), and a
// timeout names the rank that never reached the collective.
//
// Every test needs two GPUs and skips, saying so, with fewer. The ranks are
// forked, and a process that has initialised CUDA cannot fork a child that
// uses it, so this process never touches CUDA itself: even the device count
// is asked of a child.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_nccl.h>

#include "gpu/gpu_testing.h"
#include "testing/mismatch_case.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ddp::testing::ProcessResult;
using ddp::testing::run_processes;
using ddp::testing::MismatchCase;
using ddp_gpu_test::cuda;
using Clock = std::chrono::steady_clock;

// Exit codes: kSawExpected ... kTooSlow come from testing/mismatch_case.h;
// this one is this test's own.
using namespace ddp::testing;
constexpr int kWrongResult = 16;

// The number of CUDA devices, from a child process (see the file comment).
// The child exits with 100 + the count, so that its exit code 1 for an
// exception is not read as one device.
int visible_devices() {
  static const int count = [] {
    const auto results = run_processes(
        1, [](int, std::shared_ptr<Store>) { return 100 + std::min(ddp_gpu_test::device_count(), 100); },
        120s);
    if (results[0].exit_code < 100) {
      std::fprintf(stderr, "counting CUDA devices failed (exit code %d, signal %d): %s\n",
                   results[0].exit_code, results[0].signal, results[0].output.c_str());
      return 0;
    }
    return results[0].exit_code - 100;
  }();
  return count;
}

// DDP_REQUIRE_GPUS (gpu_testing.h) without initialising CUDA here.
#define DDP_REQUIRE_GPUS_IN_CHILDREN(needed)                                         \
  do {                                                                               \
    const int found = visible_devices();                                             \
    if (found == 0) {                                                                \
      GTEST_SKIP() << ::ddp_gpu_test::kNoDevice;                                     \
    }                                                                                \
    if (found < (needed)) {                                                          \
      GTEST_SKIP() << "this test needs " << (needed) << " CUDA devices, found " << found \
                   << " (NCCL runs one rank per GPU)";                               \
    }                                                                                \
  } while (false)

// A group of two ranks, rank r on cuda:r, over the child's store.
std::shared_ptr<ProcessGroupNCCL> make_group(std::shared_ptr<Store> store, int rank,
                                             std::chrono::milliseconds timeout = 20s) {
  return ProcessGroupNCCL::create(
      std::move(store), rank, 2,
      ProcessGroupNCCLOptions().timeout(timeout).group_name("nccl-fingerprint").device_index(rank));
}

at::Tensor ones(int64_t numel, int rank, at::ScalarType dtype = at::kFloat) {
  return torch::ones({numel}, torch::dtype(dtype).device(cuda(rank)));
}

void expect_ranks(const std::vector<ProcessResult>& results, int expected_code) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    std::fprintf(stderr, "rank %zu: %s", rank, results[rank].output.c_str()); // for ctest -V
    EXPECT_EQ(results[rank].signal, 0) << "rank " << rank << " crashed:\n" << results[rank].output;
    EXPECT_FALSE(results[rank].timed_out) << "rank " << rank << " hung:\n" << results[rank].output;
    EXPECT_EQ(results[rank].exit_code, expected_code) << "rank " << rank << ":\n" << results[rank].output;
  }
}

class NcclMismatch : public ::testing::TestWithParam<MismatchCase> {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS_IN_CHILDREN(2);
  }
};

// wait() with a timeout blocks until the GPU has finished, so it sees the
// check's verdict (Note [NCCL fingerprint check]).
TEST_P(NcclMismatch, IsAnErrorNamingBothCallsOnEveryRank) {
  const MismatchCase c = GetParam();
  const auto results = run_processes(
      2,
      [&c](int rank, std::shared_ptr<Store> store) -> int {
        auto pg = make_group(store, rank);
        // Long before the group's 20 s timeout: the check is read when the
        // GPU finishes, a hang is compared after 1 s.
        return run_mismatch_case(*pg, c, rank, ones(16, rank), 10s, 60s);
      },
      120s);
  expect_ranks(results, kSawExpected);
}

INSTANTIATE_TEST_SUITE_P(
    Nccl, NcclMismatch,
    ::testing::Values(
        MismatchCase{"AllreduceCount1000vs2000",
                     [](ProcessGroup& pg, int rank) {
                       return pg.allreduce(ones(rank == 0 ? 1000 : 2000, rank));
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with float32[", rank == 0 ? 1000 : 2000, "] SUM");
                     }},
        MismatchCase{"AllreduceCount1Mvs4M",
                     [](ProcessGroup& pg, int rank) {
                       return pg.allreduce(ones(rank == 0 ? (1 << 20) : (4 << 20), rank));
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with float32[", rank == 0 ? (1 << 20) : (4 << 20),
                                       "] SUM");
                     }},
        MismatchCase{"AllreduceDtypeSameBytes",
                     [](ProcessGroup& pg, int rank) {
                       return pg.allreduce(ones(1000, rank, rank == 0 ? at::kFloat : at::kInt));
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with ", rank == 0 ? "float32" : "int32", "[1000] SUM");
                     }},
        MismatchCase{"AllreduceSumVsMax",
                     [](ProcessGroup& pg, int rank) {
                       AllreduceOptions options;
                       options.op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
                       return pg.allreduce(ones(1000, rank), options);
                     },
                     [](int rank) {
                       return c10::str("allreduce #1 with float32[1000] ", rank == 0 ? "SUM" : "MAX");
                     }},
        MismatchCase{"BroadcastRoots",
                     [](ProcessGroup& pg, int rank) {
                       BroadcastOptions options;
                       options.root_rank = rank; // each rank thinks it is the root
                       return pg.broadcast(ones(1000, rank), options);
                     },
                     [](int rank) { return c10::str("broadcast #1 with float32[1000] root ", rank); }},
        MismatchCase{"AllreduceVsBroadcast",
                     [](ProcessGroup& pg, int rank) {
                       return rank == 0 ? pg.allreduce(ones(1000, rank)) : pg.broadcast(ones(1000, rank));
                     },
                     [](int rank) {
                       return rank == 0 ? std::string("allreduce #1 with float32[1000] SUM")
                                        : std::string("broadcast #1 with float32[1000] root 0");
                     }},
        MismatchCase{"BarrierVsAllreduce",
                     [](ProcessGroup& pg, int rank) {
                       return rank == 0 ? pg.barrier() : pg.allreduce(ones(1, rank));
                     },
                     [](int rank) {
                       return rank == 0 ? std::string("barrier #1 with no tensor")
                                        : std::string("allreduce #1 with float32[1] SUM");
                     }}),
    ddp::testing::mismatch_case_name);

// A plain wait() does not block the CPU: it may return before the GPU has
// run the collective, so the Work may count as a success and the mismatch
// fail a later operation instead (the gap named in Note [NCCL fingerprint
// check]; a later operation that matched may also complete before the
// watchdog has failed the group). Either way the group stops within a few
// seconds, and says why.
TEST(NcclFingerprint, NonBlockingWaitStillStopsTheGroup) {
  DDP_REQUIRE_GPUS_IN_CHILDREN(2);
  const auto results = run_processes(
      2,
      [](int rank, std::shared_ptr<Store> store) -> int {
        auto pg = make_group(store, rank);
        auto t = ones(1000, rank);
        pg->allreduce(t)->wait(60s);
        AllreduceOptions options;
        options.op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
        const auto start = Clock::now();
        try {
          pg->allreduce(t, options)->wait(); // #1: SUM against MAX, same bytes
          while (Clock::now() - start < 10s) {
            pg->allreduce(t)->wait(60s);
            std::this_thread::sleep_for(100ms);
          }
        } catch (const CommError& e) {
          std::fprintf(stderr, "%s\n", e.what());
          const std::string mismatch = c10::str("allreduce #1: rank ", 1 - rank,
                                                " called allreduce #1 with float32[1000] ",
                                                rank == 0 ? "MAX" : "SUM");
          return std::string(e.what()).find(mismatch) != std::string::npos ? kSawExpected
                                                                           : kSawWrongMessage;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "unexpected error: %s\n", e.what());
          return kSawOtherError;
        }
        return kNoError;
      },
      120s);
  expect_ranks(results, kSawExpected);
}

// The checks change nothing for calls that match: results, a barrier, an
// empty tensor, and more collectives in flight at once than one chunk of
// check slots holds (FingerprintSlots::kSlotsPerChunk).
TEST(NcclFingerprint, MatchedCollectivesPassTheCheck) {
  DDP_REQUIRE_GPUS_IN_CHILDREN(2);
  const auto results = run_processes(
      2,
      [](int rank, std::shared_ptr<Store> store) -> int {
        try {
          auto pg = make_group(store, rank);
          auto sum = torch::full({1000}, rank + 1, torch::dtype(torch::kFloat).device(cuda(rank)));
          pg->allreduce(sum)->wait(60s);
          auto root1 = torch::full({7}, rank, torch::dtype(torch::kLong).device(cuda(rank)));
          BroadcastOptions from1;
          from1.root_rank = 1;
          pg->broadcast(root1, from1)->wait(60s);
          pg->barrier()->wait(60s);
          pg->allreduce(torch::empty({0}, cuda(rank)))->wait(60s);
          std::vector<std::shared_ptr<Work>> works;
          std::vector<at::Tensor> tensors;
          for (int i = 0; i < 200; ++i) {
            tensors.push_back(torch::full({3}, i, torch::dtype(torch::kFloat).device(cuda(rank))));
            works.push_back(pg->allreduce(tensors.back()));
          }
          for (auto& work : works) {
            work->wait(60s);
          }
          bool right = sum.eq(3).all().item<bool>() && root1.eq(1).all().item<bool>();
          for (int i = 0; i < 200; ++i) {
            right = right && tensors[static_cast<size_t>(i)].eq(2 * i).all().item<bool>();
          }
          return right ? kSawExpected : kWrongResult;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "unexpected error: %s\n", e.what());
          return kSawOtherError;
        }
      },
      120s);
  expect_ranks(results, kSawExpected);
}

// A rank that never reaches a collective: the other's timeout names it
// (it published its own fingerprint from the stall check).
TEST(NcclFingerprint, TimeoutNamesTheRankThatHadNotArrived) {
  DDP_REQUIRE_GPUS_IN_CHILDREN(2);
  const auto results = run_processes(
      2,
      [](int rank, std::shared_ptr<Store> store) -> int {
        auto pg = make_group(store, rank);
        return run_timeout_names_missing_rank(*pg, rank, ones(16, rank), 8s, 30s);
      },
      120s);
  expect_ranks(results, kSawExpected);
}

} // namespace
} // namespace ddp
