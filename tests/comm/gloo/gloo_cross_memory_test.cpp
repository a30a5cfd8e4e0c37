// ProcessGroup::reduce_gradients on Gloo (Note [Gradients read where they
// lie]): the peers' gradients read where they lie give the bits of DDP's
// arithmetic over TCP (each gradient times 1/world, rounded, then Gloo's
// ring) on 2, 3 and 4 ranks; dtypes and layouts the direct path does not
// take go through the buffer with the same bits; a rank that calls
// allreduce where the others call reduce_gradients; the opt-out; and a rank
// killed in the middle (every survivor's error names it, within the
// deadline). Ranks as threads over a HashStore, the opt-out and the kill as
// processes.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/ScalarOps.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <string>
#include <vector>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_gloo.h>
#include <ddp/nn/distributed_data_parallel.h>

#include "testing/multi_rank.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ddp::testing::as_gloo;
using ddp::testing::make_gloo_group;
using ddp::testing::run_processes;
using ddp::testing::run_threads;

// Rank `rank`'s gradients, flat: magnitudes that differ by rank, so that a
// sum in another order rounds differently.
at::Tensor gradient_for(int rank, int64_t count, at::ScalarType dtype) {
  const auto i = torch::arange(count, torch::kDouble);
  return (torch::sin(i * (0.37 + 0.11 * rank) + rank) * std::pow(10.0, rank % 3)).to(dtype);
}

// What DDP computes over TCP: each rank's gradient times 1/world as its
// reducer rounds it (at::mul_out by a wrapped scalar), then Gloo's ring on
// private memory.
at::Tensor tcp_reference(const std::shared_ptr<ProcessGroup>& pg, const at::Tensor& gradient) {
  auto scaled = at::empty_like(gradient);
  at::mul_out(scaled, gradient, at::native::wrapped_scalar_tensor(1.0 / pg->size()));
  pg->allreduce(scaled)->wait();
  return scaled;
}

// Cuts [0, count) into uneven pieces; each becomes a tensor of its own.
std::vector<int64_t> piece_sizes(int64_t count) {
  const std::vector<int64_t> cuts = {count / 7, count / 3, 1, count / 5};
  std::vector<int64_t> sizes = cuts;
  int64_t used = 0;
  for (auto n : cuts) {
    used += n;
  }
  sizes.push_back(count - used);
  return sizes;
}

void expect_same_bits(const at::Tensor& got, const at::Tensor& expected, const std::string& what) {
  if (torch::equal(got, expected)) {
    return;
  }
  const auto differ = (got.to(torch::kDouble) != expected.to(torch::kDouble)).nonzero().flatten();
  const int64_t at = differ[0].item<int64_t>();
  ADD_FAILURE() << what << ": " << differ.numel() << " elements differ, the first at " << at << ": got "
                << std::setprecision(17) << got[at].item<double>() << ", TCP " << expected[at].item<double>();
}

TEST(GlooCrossMemory, ReduceGradientsEqualsTheTcpPathBitForBit) {
  for (int world : {2, 3, 4}) {
    run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
      auto pg = make_gloo_group(store, rank, world);
      EXPECT_FALSE(pg->reduces_gradients_in_place()) << "known only once a buffer is shared";
      for (auto dtype : {at::kFloat, at::kDouble, at::kHalf}) {
        const int64_t item = c10::elementSize(dtype);
        // Past the exchange algorithm's 64 KiB; for float also past Gloo's
        // 1 MiB segments, and past the direct path's 128 KiB pieces.
        std::vector<int64_t> sizes_in_bytes = {300000};
        if (dtype == at::kFloat) {
          sizes_in_bytes.push_back((2 * world + 1) << 20);
        }
        for (int64_t bytes : sizes_in_bytes) {
          const int64_t count = bytes / item + 3;
          SCOPED_TRACE(c10::str("world ", world, " ", dtype, " count ", count));
          auto buffer = pg->allocate_collective_buffer(count, torch::TensorOptions().dtype(dtype));
          ASSERT_TRUE(as_gloo(pg).is_shared_buffer(buffer));
          EXPECT_TRUE(pg->reduces_gradients_in_place());
          const auto gradient = gradient_for(rank, count, dtype);
          const auto reference = tcp_reference(pg, gradient);
          const bool direct = dtype != at::kHalf;

          // Every range a gradient of its own (DDP's usual bucket).
          std::vector<at::Tensor> pieces;
          std::vector<ReduceTarget> targets;
          int64_t offset = 0;
          for (int64_t n : piece_sizes(count)) {
            pieces.push_back(gradient.narrow(0, offset, n).clone());
            targets.push_back({offset, pieces.back()});
            offset += n;
          }
          const auto before = as_gloo(pg).shared_memory_stats().direct;
          pg->reduce_gradients(buffer, targets, 1.0 / world)->wait();
          EXPECT_EQ(as_gloo(pg).shared_memory_stats().direct, before + (direct ? 1 : 0));
          for (const auto& t : targets) {
            expect_same_bits(t.target, reference.narrow(0, t.offset, t.target.numel()),
                             c10::str("gradient at ", t.offset));
          }

          // One range left in the buffer (a gradient DDP copied in, scaled):
          // the gradients do not tile it, so it all goes through the buffer.
          const int64_t gap_at = targets[2].offset;
          const int64_t gap = targets[2].target.numel() + targets[3].target.numel();
          auto in_buffer = buffer.narrow(0, gap_at, gap);
          at::mul_out(in_buffer, gradient.narrow(0, gap_at, gap), at::native::wrapped_scalar_tensor(1.0 / world));
          std::vector<ReduceTarget> some;
          for (size_t i : {0, 1, 4}) {
            targets[i].target.copy_(gradient.narrow(0, targets[i].offset, targets[i].target.numel()));
            some.push_back(targets[i]);
          }
          const auto before_gap = as_gloo(pg).shared_memory_stats().direct;
          pg->reduce_gradients(buffer, some, 1.0 / world)->wait();
          EXPECT_EQ(as_gloo(pg).shared_memory_stats().direct, before_gap);
          for (const auto& t : some) {
            expect_same_bits(t.target, reference.narrow(0, t.offset, t.target.numel()),
                             c10::str("gradient at ", t.offset, " beside a gap"));
          }
          expect_same_bits(buffer.narrow(0, gap_at, gap), reference.narrow(0, gap_at, gap), "the buffer's range");
        }
      }
    });
  }
}

TEST(GlooCrossMemory, ARankThatCallsAllreduceInsteadTakesPartWithTheSameBits) {
  const int world = 3;
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    const int64_t count = 100003;
    auto buffer = pg->allocate_collective_buffer(count, torch::kFloat);
    const auto gradient = gradient_for(rank, count, at::kFloat);
    const auto reference = tcp_reference(pg, gradient);
    if (rank == 1) {
      // DDP's reducer when none of its gradients can stay in place.
      at::mul_out(buffer, gradient, at::native::wrapped_scalar_tensor(1.0 / world));
      pg->allreduce(buffer)->wait();
      expect_same_bits(buffer, reference, "rank 1's buffer");
    } else {
      auto whole = gradient.clone();
      pg->reduce_gradients(buffer, {ReduceTarget{0, whole}}, 1.0 / world)->wait();
      expect_same_bits(whole, reference, "the gradient");
    }
    EXPECT_EQ(as_gloo(pg).shared_memory_stats().direct, 0);
  });
}

TEST(GlooCrossMemory, ArgumentsAreCheckedAndNamed) {
  run_threads(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2);
    auto buffer = torch::zeros({100}, torch::kFloat);
    const auto expect_error = [&](std::vector<ReduceTarget> targets, const std::string& part) {
      try {
        pg->reduce_gradients(buffer, std::move(targets), 0.5);
        ADD_FAILURE() << "no error; expected one saying '" << part << "'";
      } catch (const c10::Error& e) {
        const std::string message = e.what_without_backtrace();
        EXPECT_NE(message.find("[rank " + std::to_string(rank) + "/2] reduce_gradients"), std::string::npos)
            << message;
        EXPECT_NE(message.find(part), std::string::npos) << message;
      }
    };
    expect_error({{0, torch::zeros({60})}, {50, torch::zeros({10})}}, "overlaps the range of another target");
    expect_error({{95, torch::zeros({10})}}, "ends past the buffer's 100 elements");
    expect_error({{0, torch::zeros({10}, torch::kDouble)}}, "of the buffer's dtype Float");
    expect_error({{0, buffer.narrow(0, 20, 10)}}, "lies in the buffer's own memory");
    expect_error({{0, torch::zeros({4, 10}).t()}}, "not contiguous");
  });
}

TEST(GlooCrossMemory, ARankThatOptsOutTurnsItOffForEveryRank) {
  const auto results = run_processes(
      2,
      [](int rank, std::shared_ptr<Store> store) -> int {
        if (rank == 1) {
          setenv("DDP_CROSS_MEMORY", "0", 1);
        }
        auto pg = make_gloo_group(store, rank, 2);
        const int64_t count = 50000;
        auto buffer = pg->allocate_collective_buffer(count, torch::kFloat);
        if (!pg->is_shared_buffer(buffer)) {
          return 20;
        }
        if (pg->reduces_gradients_in_place()) {
          return 21;
        }
        const auto gradient = gradient_for(rank, count, at::kFloat);
        const auto reference = tcp_reference(pg, gradient);
        auto whole = gradient.clone();
        pg->reduce_gradients(buffer, {ReduceTarget{0, whole}}, 0.5)->wait();
        if (!torch::equal(whole, reference)) {
          return 22;
        }
        return as_gloo(pg).shared_memory_stats().direct == 0 ? 0 : 23;
      },
      60s);
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 0) << result.output;
  }
}

TEST(GlooCrossMemory, RankKilledMidReductionIsNamedWithinTheDeadline) {
  const auto results = run_processes(
      3,
      [](int rank, std::shared_ptr<Store> store) -> int {
        auto pg = make_gloo_group(store, rank, 3, 20s);
        if (rank == 1) {
          setenv("DDP_TEST_SHM_KILL_AT", "direct:1", 1);
        }
        const int64_t count = 1 << 20;
        auto buffer = pg->allocate_collective_buffer(count, torch::kFloat);
        auto gradient = torch::ones({count});
        return ddp::testing::survivor_outcome(rank, 1, [&] {
          for (int i = 0; i < 5; ++i) {
            pg->reduce_gradients(buffer, {ReduceTarget{0, gradient}}, 1.0 / 3)->wait();
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
}

// DDP with its defaults on `world` ranks (processes) for three SGD steps,
// `cross_memory` saying whether the gradients may be read where they lie:
// returns rank 0's parameters, flat, as raw bytes, and fails if the path
// that should have run did not. Small buckets, so that there are several.
std::string ddp_parameters_after_training(int world, bool cross_memory, at::ScalarType dtype) {
  const std::string file = ::testing::TempDir() + "ddp_cross_memory_" + std::to_string(getpid());
  const auto results = run_processes(
      world,
      [&](int rank, std::shared_ptr<Store> store) -> int {
        setenv("DDP_CROSS_MEMORY", cross_memory ? "1" : "0", 1);
        at::set_num_threads(1);
        auto pg = make_gloo_group(store, rank, world);
        torch::manual_seed(7);
        torch::nn::Sequential net(torch::nn::Linear(300, 400), torch::nn::ReLU(), torch::nn::Linear(400, 200),
                                  torch::nn::Linear(200, 50));
        net->to(dtype);
        DistributedDataParallel model(
            net, DistributedDataParallelOptions().process_group(pg).bucket_cap_mb(0.5));
        torch::optim::SGD optimizer(model->parameters(), 0.05);
        torch::manual_seed(100 + rank);
        for (int step = 0; step < 3; ++step) {
          optimizer.zero_grad();
          const auto x = torch::randn({16, 300}, dtype);
          model->forward(x).pow(2).mean().backward();
          optimizer.step();
        }
        const auto direct = as_gloo(pg).shared_memory_stats().direct;
        if (cross_memory != (direct > 0)) {
          std::fprintf(stderr, "rank %d: %lld reductions read in place, cross_memory %d\n", rank,
                       static_cast<long long>(direct), static_cast<int>(cross_memory));
          return 30;
        }
        if (rank == 0) {
          std::vector<at::Tensor> flat;
          for (const auto& p : net->parameters()) {
            flat.push_back(p.detach().reshape({-1}));
          }
          const auto all = torch::cat(flat).contiguous();
          std::ofstream(file, std::ios::binary)
              .write(static_cast<const char*>(all.data_ptr()), static_cast<std::streamsize>(all.nbytes()));
        }
        return 0;
      },
      120s);
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 0) << result.output;
  }
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(file.c_str());
  return bytes;
}

TEST(GlooCrossMemory, DdpTrainsToTheSameBitsAsThroughTheBuckets) {
  for (int world : {2, 3}) {
    for (auto dtype : {at::kFloat, at::kDouble}) {
      SCOPED_TRACE(c10::str("world ", world, " ", dtype));
      const auto in_place = ddp_parameters_after_training(world, true, dtype);
      const auto through_buckets = ddp_parameters_after_training(world, false, dtype);
      ASSERT_FALSE(in_place.empty());
      EXPECT_TRUE(in_place == through_buckets) << "the parameters differ";
    }
  }
}

} // namespace
} // namespace ddp
