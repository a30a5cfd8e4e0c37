// The Gloo backend's buffers in shared memory (Note [Shared buffers]):
// results equal to the TCP path's bit for bit on 2, 3 and 4 ranks for every
// reduce op and dtype (allreduce and reduce-scatter), ranges and mixed
// callers, the opt-out, and a rank killed while allocating or in the middle
// of an allreduce or a reduce-scatter (every survivor
// gets an error naming it within the deadline; nothing stays in /dev/shm).
// Ranks as threads over a HashStore, the kills as processes.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <set>
#include <string>
#include <thread>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_gloo.h>
#include <ddp/store/hash_store.h>

#include "testing/multi_rank.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ddp::testing::as_gloo;
using ddp::testing::make_gloo_group;
using ddp::testing::run_processes;
using ddp::testing::run_threads;

// Rank `rank`'s input: values whose reduction rounds differently in
// different orders, so that a wrong order shows in the bits.
at::Tensor input_for(ReduceOp op, int rank, int64_t count, at::ScalarType dtype) {
  const auto i = torch::arange(count, torch::kDouble);
  if (dtype == at::kBool) {
    return (torch::arange(count, torch::kLong) + rank).remainder(3) == 0;
  }
  if (at::isFloatingType(dtype)) {
    const auto wave = torch::sin(i * (0.37 + 0.11 * rank) + rank);
    if (op == ReduceOp::kProduct) {
      return (1 + 0.01 * wave).to(dtype);
    }
    return (wave * std::pow(10.0, rank % 3)).to(dtype);
  }
  const auto k = torch::arange(count, torch::kLong);
  switch (op) {
    case ReduceOp::kProduct:
      return ((k * (rank + 1)).remainder(3) - 1).to(dtype); // -1, 0, 1
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return (k * (2 * rank + 3)).remainder(127).to(dtype);
    default:
      return ((k * (2 * rank + 3)).remainder(41) - 20).to(dtype);
  }
}

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  if (at::isFloatingType(dtype)) {
    ops.push_back(ReduceOp::kAvg);
  } else {
    ops.insert(ops.end(), {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor});
  }
  return ops;
}

TEST(GlooSharedBuffers, EveryDtypeAndOpEqualsTheTcpPathBitForBit) {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                              at::kChar,  at::kByte,   at::kShort, at::kInt,
                                              at::kLong,  at::kBool};
  for (int world : {2, 3, 4}) {
    run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
      auto pg = make_gloo_group(store, rank, world);
      int64_t expected_shared = 0;
      int64_t expected_scatters = 0;
      for (auto dtype : dtypes) {
        const int64_t item = c10::elementSize(dtype);
        // Just past the exchange algorithm's 64 KiB, and (for two dtypes, to
        // keep the test short) large enough that Gloo's ring cuts its chunks
        // into segments of its 1 MiB limit.
        const bool large = dtype == at::kFloat || dtype == at::kChar;
        for (int64_t bytes : {int64_t{65536 + 3 * 8}, large ? int64_t{(2 * world + 1) << 20} : int64_t{300000}}) {
          const int64_t count = (bytes / item + 3) / world * world; // parts for the reduce-scatter
          auto buffer = pg->allocate_collective_buffer(count, torch::TensorOptions().dtype(dtype));
          ASSERT_TRUE(as_gloo(pg).is_shared_buffer(buffer)) << dtype << " count " << count;
          ASSERT_TRUE(torch::equal(buffer, torch::zeros({count}, dtype))) << "not zero-filled";
          for (auto op : ops_for(dtype)) {
            SCOPED_TRACE(c10::str("world ", world, " ", dtype, " ", to_string(op), " count ", count));
            const auto input = input_for(op, rank, count, dtype);
            auto reference = input.clone(); // private memory: Gloo's ring over TCP
            pg->allreduce(reference, {op})->wait();
            buffer.copy_(input);
            pg->allreduce(buffer, {op})->wait();
            ++expected_shared;
            if (!torch::equal(buffer, reference)) {
              const auto differ = (buffer.to(torch::kDouble) != reference.to(torch::kDouble)).nonzero().flatten();
              const int64_t at = differ[0].item<int64_t>();
              FAIL() << differ.numel() << " elements differ, the first at " << at << ": shared "
                     << std::setprecision(10) << buffer[at].item<double>() << ", TCP "
                     << reference[at].item<double>() << "; last at " << differ[-1].item<int64_t>();
            }
            // The reduce-scatter, in place into this rank's own part (as
            // FSDP's gradient reduction) and into a tensor of its own.
            const int64_t part = count / world;
            auto scattered = torch::empty({part}, dtype);
            pg->reduce_scatter(scattered, input.split(part), {op})->wait(); // private: TCP
            buffer.copy_(input);
            auto own = buffer.narrow(0, rank * part, part);
            pg->reduce_scatter(own, buffer.split(part), {op})->wait();
            EXPECT_TRUE(torch::equal(own, scattered)) << "reduce_scatter in place differs from TCP's";
            buffer.copy_(input);
            auto apart = torch::empty({part}, dtype);
            pg->reduce_scatter(apart, buffer.split(part), {op})->wait();
            EXPECT_TRUE(torch::equal(apart, scattered)) << "reduce_scatter differs from TCP's";
            expected_scatters += 2;
          }
        }
      }
      EXPECT_EQ(as_gloo(pg).shared_memory_stats().allreduces, expected_shared);
      EXPECT_EQ(as_gloo(pg).shared_memory_stats().reduce_scatters, expected_scatters);
      EXPECT_GT(as_gloo(pg).shared_memory_stats().bytes, 0);
    });
  }
}

TEST(GlooSharedBuffers, RangesMixedCallersAndAllgather) {
  run_threads(3, [](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 3);
    const double w = 3;
    const double sum_of_ranks = 3;
    auto buffer = pg->allocate_collective_buffer(100000, torch::kFloat);
    ASSERT_TRUE(pg->is_shared_buffer(buffer));

    // The same range on every rank: reduced, the rest untouched.
    buffer.fill_(rank);
    auto middle = buffer.narrow(0, 1000, 50000);
    EXPECT_TRUE(pg->is_shared_buffer(middle));
    pg->allreduce(middle)->wait();
    EXPECT_TRUE(torch::equal(middle, torch::full({50000}, sum_of_ranks)));
    EXPECT_TRUE(torch::equal(buffer.narrow(0, 0, 1000), torch::full({1000}, 1.0 * rank)));
    EXPECT_TRUE(torch::equal(buffer.narrow(0, 51000, 49000), torch::full({49000}, 1.0 * rank)));
    const auto shared_after_range = as_gloo(pg).shared_memory_stats().allreduces;
    EXPECT_EQ(shared_after_range, 1);

    // Different ranges on different ranks: each rank's own tensor is
    // reduced, over TCP.
    buffer.fill_(rank);
    auto own = buffer.narrow(0, rank * 20000, 40000);
    pg->allreduce(own, {ReduceOp::kMax})->wait();
    EXPECT_TRUE(torch::equal(own, torch::full({40000}, w - 1)));

    // Rank 0 passes the buffer, the others a private tensor.
    auto privately = torch::full({100000}, 1.0 * rank);
    auto& mine = rank == 0 ? buffer : privately;
    mine.fill_(rank + 1);
    pg->allreduce(mine)->wait();
    EXPECT_TRUE(torch::equal(mine, torch::full({100000}, sum_of_ranks + w)));
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().allreduces, shared_after_range);

    // allgather_into_tensor from a shared input, and from a private one.
    auto input = buffer.narrow(0, 0, 30000);
    input.fill_(rank * 10);
    auto gathered = torch::empty({90000});
    pg->allgather_into_tensor(gathered, input)->wait();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(torch::equal(gathered.narrow(0, r * 30000, 30000), torch::full({30000}, 10.0 * r)));
    }
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().allgathers, 1);
    auto private_input = torch::full({30000}, rank * 10.0);
    auto gathered_again = torch::empty({90000});
    pg->allgather_into_tensor(gathered_again, private_input)->wait();
    EXPECT_TRUE(torch::equal(gathered, gathered_again));
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().allgathers, 1);

    // A buffer outlives its group; freeing it unmaps it.
    const auto before = as_gloo(pg).shared_memory_stats().buffers;
    buffer = at::Tensor();
    middle = own = input = at::Tensor();
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().buffers, before - 1);
  });
}

// A group of 2 in which rank 1 opts out of shared buffers.
std::shared_ptr<ProcessGroupGloo> group_with_rank_1_opted_out(const std::shared_ptr<Store>& store, int rank,
                                                               const std::string& name) {
  return ProcessGroupGloo::create(
      store, rank, 2,
      ProcessGroupGlooOptions()
          .hostname("127.0.0.1")
          .group_name(name + "-" + store->get_string("testing/run_id"))
          .shared_memory_min_bytes(rank == 1 ? -1 : 0));
}

TEST(GlooSharedBuffers, ARankThatOptsOutTurnsItOffForEveryRank) {
  run_threads(2, [](int rank, std::shared_ptr<Store> store) {
    auto pg = group_with_rank_1_opted_out(store, rank, "opt-out");
    auto buffer = pg->allocate_collective_buffer(50000, torch::kFloat);
    EXPECT_FALSE(pg->is_shared_buffer(buffer));
    buffer.fill_(rank + 1);
    pg->allreduce(buffer)->wait();
    EXPECT_TRUE(torch::equal(buffer, torch::full({50000}, 3.0)));
    EXPECT_EQ(pg->shared_memory_stats().allreduces, 0);
  });
}

// The names under /dev/shm that ddp makes.
std::set<std::string> ddp_objects() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const auto name = entry.path().filename().string();
    if (name.rfind("ddp-", 0) == 0) {
      names.insert(name);
    }
  }
  return names;
}

// Objects that appeared since `before` and are still there a moment later
// (another test's allocation in progress unlinks its names within
// milliseconds).
std::set<std::string> left_behind(const std::set<std::string>& before) {
  std::set<std::string> left;
  for (int attempt = 0; attempt < 20; ++attempt) {
    left.clear();
    for (const auto& name : ddp_objects()) {
      if (before.count(name) == 0) {
        left.insert(name);
      }
    }
    if (left.empty()) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  return left;
}

// Rank 1 of 3 kills itself at `point` (DDP_TEST_SHM_KILL_AT); the others
// must raise a RemoteError naming rank 1 well before the deadline.
void expect_named_error_after_kill(const char* point, bool while_allocating, bool common = false) {
  const auto before = ddp_objects();
  const auto results = run_processes(
      3,
      [point, while_allocating, common](int rank, std::shared_ptr<Store> store) -> int {
        constexpr auto kTimeout = 20s;
        auto pg = make_gloo_group(store, rank, 3, kTimeout);
        if (rank == 1) {
          setenv("DDP_TEST_SHM_KILL_AT", (std::string(point) + ":1").c_str(), 1);
        }
        return ddp::testing::survivor_outcome(rank, 1, [&] {
          auto buffer = common ? pg->allocate_common_buffer(1 << 20, torch::kFloat)
                               : pg->allocate_collective_buffer(1 << 20, torch::kFloat);
          if (while_allocating) {
            return;
          }
          buffer.fill_(1);
          for (int i = 0; i < 5; ++i) {
            if (std::string(point) == "scatter") {
              auto part = buffer.narrow(0, rank * (1 << 18), 1 << 18); // 3 of the 4 quarters
              pg->reduce_scatter(part, buffer.narrow(0, 0, 3 << 18).split(1 << 18))->wait();
            } else {
              pg->allreduce(buffer)->wait();
            }
          }
        });
      },
      60s);
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].output;
  for (int rank : {0, 2}) {
    EXPECT_FALSE(results[rank].timed_out) << results[rank].output;
    EXPECT_EQ(results[rank].exit_code, ddp::testing::kSawRemoteErrorNamingIt)
        << "rank " << rank << " exit " << results[rank].exit_code << ": " << results[rank].output;
  }
  const auto left = left_behind(before);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << *left.begin();
}

TEST(GlooSharedBuffers, RankKilledMidAllreduceIsNamedAndLeavesNothing) {
  expect_named_error_after_kill("agreed", false);
}

TEST(GlooSharedBuffers, RankKilledMidReduceScatterIsNamedAndLeavesNothing) {
  expect_named_error_after_kill("scatter", false);
}

TEST(GlooSharedBuffers, RankKilledWhileAllocatingIsNamedAndLeavesNothing) {
  // Killed with its object created and its name not yet unlinked: the
  // survivors unlink it.
  expect_named_error_after_kill("created", true);
}

TEST(GlooSharedBuffers, RankKilledWhileAllocatingACommonBufferIsNamedAndLeavesNothing) {
  // Rank 0 has created the one object; rank 1 dies before mapping it.
  expect_named_error_after_kill("created", true, /*common=*/true);
}

// Note [Common buffers]: one memory for every rank, which no collective
// takes through shared memory; the opt-out gives none.
TEST(GlooSharedBuffers, CommonBufferIsOneMemoryForEveryRank) {
  run_threads(3, [](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 3);
    auto common = pg->allocate_common_buffer(90000, torch::kFloat);
    ASSERT_TRUE(common.defined());
    EXPECT_EQ(common.numel(), 90000);
    EXPECT_FALSE(pg->is_shared_buffer(common));
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().bytes, 90000 * 4 / 3);
    // The ranks' tensors are views of one memory: each writes its part,
    // and after a barrier every rank reads every part.
    EXPECT_TRUE(torch::equal(common, torch::zeros({90000})));
    pg->barrier()->wait();
    common.narrow(0, rank * 30000, 30000).fill_(rank + 1);
    pg->barrier()->wait();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(torch::equal(common.narrow(0, r * 30000, 30000), torch::full({30000}, r + 1.0))) << "part " << r;
    }
    // Gathered over TCP from a part of it (never read from the peers' memory
    // in place), it gives the same.
    auto gathered = torch::empty({90000});
    pg->allgather_into_tensor(gathered, common.narrow(0, rank * 30000, 30000))->wait();
    EXPECT_TRUE(torch::equal(gathered, common));
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().allgathers, 0);
    pg->barrier()->wait(); // no rank frees it while another reads it
    const auto before = as_gloo(pg).shared_memory_stats().buffers;
    common = at::Tensor();
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().buffers, before - 1);
  });
  run_threads(2, [](int rank, std::shared_ptr<Store> store) {
    auto pg = group_with_rank_1_opted_out(store, rank, "common-opt-out");
    EXPECT_FALSE(pg->allocate_common_buffer(50000, torch::kFloat).defined());
  });
}

TEST(GlooSharedBuffers, EnvironmentTurnsItOffOrIsAClearError) {
  const auto results = run_processes(
      2,
      [](int rank, std::shared_ptr<Store> store) -> int {
        setenv("DDP_GLOO_SHM", "0", 1);
        auto pg = make_gloo_group(store, rank, 2);
        auto buffer = pg->allocate_collective_buffer(50000, torch::kFloat);
        if (pg->is_shared_buffer(buffer)) {
          return 20;
        }
        setenv("DDP_GLOO_SHM", "yes", 1);
        try {
          ProcessGroupGloo::create(std::make_shared<HashStore>(), 0, 1);
          return 21;
        } catch (const c10::Error& e) {
          return std::string(e.what()).find("DDP_GLOO_SHM must be 0 or 1 (got 'yes')") != std::string::npos ? 0
                                                                                                          : 22;
        }
      },
      60s);
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 0) << result.output;
  }
}

TEST(GlooSharedBuffers, DevShmTooSmallGivesPrivateBuffersAndAWarning) {
  // A 1 MiB /dev/shm, as a container's default 64 MiB is for a large model,
  // in a mount namespace of the child's own (root, as in CI).
  const auto results = run_processes(
      1,
      [](int, std::shared_ptr<Store>) -> int {
        if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0) {
          std::fprintf(stderr, "cannot mount a small /dev/shm in a mount namespace (needs root): %s\n",
                       std::strerror(errno));
          return 30;
        }
        int code = 0;
        run_threads(2, [&code](int rank, std::shared_ptr<Store> store) {
          auto pg = make_gloo_group(store, rank, 2);
          auto small = pg->allocate_collective_buffer(50000, torch::kFloat); // 200 KB: fits
          auto large = pg->allocate_collective_buffer(1 << 20, torch::kFloat); // 4 MiB: does not
          if (!pg->is_shared_buffer(small) || pg->is_shared_buffer(large)) {
            code = 31;
          }
          large.fill_(rank + 1);
          pg->allreduce(large)->wait();
          if (!torch::equal(large, torch::full({1 << 20}, 3.0))) {
            code = 32;
          }
        });
        return code;
      },
      60s);
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].output.find("buffers in shared memory are not available"), std::string::npos)
      << results[0].output;
  EXPECT_NE(results[0].output.find("/dev/shm has"), std::string::npos) << results[0].output;
}

} // namespace
} // namespace ddp
