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

// ---- Buffers in shared memory (Note [Shared buffers]) --------------------------

// Rank `rank`'s input for `op`: values whose reductions are exact in every
// dtype on up to 4 ranks.
at::Tensor shared_test_input(ReduceOp op, int rank, int64_t count, at::ScalarType dtype) {
  if (dtype == at::kBool) {
    return torch::full({count}, rank == 0, torch::kBool);
  }
  switch (op) {
    case ReduceOp::kProduct:
      return torch::full({count}, rank + 1, torch::kLong).to(dtype);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return torch::full({count}, int64_t{1} << rank, torch::kLong).to(dtype);
    default:
      return (torch::arange(count, torch::kLong).remainder(5) + rank).to(dtype);
  }
}

TEST(MpiSharedBuffers, EveryDtypeAndOpMatchesThePrivatePath) {
  // Every allreduce of a whole shared buffer gives what the same allreduce
  // of a private tensor gives (MPI_Allreduce, or the ring for the large
  // count), bit for bit, for sizes that do not split evenly among the ranks;
  // and every reduce-scatter of one what the private path gives.
  auto pg = ProcessGroupMPI::create(ProcessGroupMPIOptions().shared_memory_min_bytes(0));
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                              at::kChar,  at::kByte,   at::kShort, at::kInt,
                                              at::kLong,  at::kBool};
  for (auto dtype : dtypes) {
    std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
    if (at::isFloatingType(dtype)) {
      ops.push_back(ReduceOp::kAvg);
    } else {
      ops.insert(ops.end(), {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor});
    }
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{2500001}}) {
      auto buffer = pg->allocate_collective_buffer(count, torch::TensorOptions().dtype(dtype));
      ASSERT_EQ(buffer.numel(), count);
      ASSERT_EQ(buffer.scalar_type(), dtype);
      ASSERT_TRUE(torch::equal(buffer, torch::zeros({count}, dtype))) << "not zero-filled";
      // A world of one has no one to share with.
      ASSERT_EQ(pg->is_shared_buffer(buffer), pg->size() > 1) << dtype << " count " << count;
      for (auto op : ops) {
        SCOPED_TRACE(c10::str(dtype, " ", to_string(op), " count ", count));
        const auto input = shared_test_input(op, pg->rank(), count, dtype);
        auto reference = input.clone();
        pg->allreduce(reference, {op})->wait();
        buffer.copy_(input);
        pg->allreduce(buffer, {op})->wait();
        ASSERT_TRUE(torch::equal(buffer, reference));
        // The reduce-scatter of the buffer's first size x part elements, in
        // place into this rank's own part (FSDP's gradient reduction).
        const int64_t part = count / pg->size();
        if (part > 0) {
          const auto parts = input.narrow(0, 0, part * pg->size());
          auto scattered = torch::empty({part}, dtype);
          pg->reduce_scatter(scattered, parts.split(part), {op})->wait();
          buffer.copy_(input);
          auto own = buffer.narrow(0, pg->rank() * part, part);
          pg->reduce_scatter(own, buffer.narrow(0, 0, part * pg->size()).split(part), {op})->wait();
          ASSERT_TRUE(torch::equal(own, scattered)) << "reduce_scatter";
        }
      }
    }
  }
}

TEST(MpiSharedBuffers, RangesMixedCallersAndLifetimes) {
  auto pg = ProcessGroupMPI::create(ProcessGroupMPIOptions().shared_memory_min_bytes(0));
  const int rank = pg->rank();
  const double w = pg->size();
  const double sum_of_ranks = w * (w - 1) / 2;
  auto buffer = pg->allocate_collective_buffer(1000, torch::kFloat);

  // The same range of the buffer on every rank: reduced, the rest untouched.
  buffer.fill_(rank);
  auto middle = buffer.narrow(0, 100, 500);
  EXPECT_EQ(pg->is_shared_buffer(middle), pg->size() > 1);
  pg->allreduce(middle)->wait();
  EXPECT_TRUE(torch::equal(middle, torch::full({500}, sum_of_ranks)));
  EXPECT_TRUE(torch::equal(buffer.narrow(0, 0, 100), torch::full({100}, 1.0 * rank)));
  EXPECT_TRUE(torch::equal(buffer.narrow(0, 600, 400), torch::full({400}, 1.0 * rank)));

  // Different ranges on different ranks: each rank's own tensor is reduced,
  // through messages.
  buffer.fill_(rank);
  auto own_half = buffer.narrow(0, rank % 2 == 0 ? 0 : 500, 500);
  pg->allreduce(own_half, {ReduceOp::kMax})->wait();
  EXPECT_TRUE(torch::equal(own_half, torch::full({500}, w - 1)));

  // Rank 0 passes the buffer, the others a private tensor.
  auto privately = torch::full({1000}, 1.0 * rank);
  auto& mine = rank == 0 ? buffer : privately;
  mine.fill_(rank + 1);
  pg->allreduce(mine)->wait();
  EXPECT_TRUE(torch::equal(mine, torch::full({1000}, sum_of_ranks + w)));

  // Several tensors in one call, and the average.
  buffer.fill_(rank);
  auto first = buffer.narrow(0, 0, 10);
  auto second = buffer.narrow(0, 10, 990);
  pg->allreduce_coalesced({first, second}, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(torch::allclose(buffer, torch::full({1000}, sum_of_ranks / w)));
  buffer.fill_(2 * rank);
  pg->allreduce(buffer, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(torch::allclose(buffer, torch::full({1000}, 2 * sum_of_ranks / w)));

  // A buffer freed on every rank, then a new one; and one that outlives its
  // group: still memory this rank may read and write.
  buffer = at::Tensor();
  auto next = pg->allocate_collective_buffer(70000, torch::kFloat);
  next.fill_(rank + 1);
  pg->allreduce(next)->wait();
  EXPECT_TRUE(torch::equal(next, torch::full({70000}, sum_of_ranks + w)));
  pg.reset();
  next.add_(1);
  EXPECT_TRUE(torch::equal(next, torch::full({70000}, sum_of_ranks + w + 1)));
}

TEST(MpiSharedBuffers, AllgatherFromSharedInputsMatchesThePrivatePath) {
  // allgather_into_tensor whose inputs are the same range of one shared
  // buffer on every rank (FSDP's shards on MPI) reads the peers' inputs
  // where they lie; every other placement goes through messages. Each gives
  // what the private path gives, and no rank's input is changed.
  auto pg = ProcessGroupMPI::create(ProcessGroupMPIOptions().shared_memory_min_bytes(0));
  const int rank = pg->rank();
  const int64_t w = pg->size();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong, at::kBool}) {
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{2500001}}) {
      SCOPED_TRACE(c10::str(dtype, " count ", count));
      auto buffer = pg->allocate_collective_buffer(count + 3, torch::TensorOptions().dtype(dtype));
      const auto values = (torch::arange(count, torch::kLong) * 3 + rank).remainder(2).to(dtype);
      auto input = buffer.narrow(0, 3, count);
      input.copy_(values);
      auto reference = torch::empty({w * count}, dtype);
      pg->allgather_into_tensor(reference, values)->wait();
      auto output = torch::empty({w * count}, dtype);
      pg->allgather_into_tensor(output, input)->wait();
      ASSERT_TRUE(torch::equal(output, reference));
      ASSERT_TRUE(torch::equal(input, values)) << "an input changed";
    }
  }
  auto buffer = pg->allocate_collective_buffer(1000 * w, torch::kFloat);
  const auto expected = torch::arange(w, torch::kFloat).repeat_interleave(1000);
  // In place: each rank's input is its own slot of the shared output.
  buffer.fill_(-1);
  buffer.narrow(0, rank * 1000, 1000).fill_(rank);
  pg->allgather_into_tensor(buffer, buffer.narrow(0, rank * 1000, 1000))->wait();
  EXPECT_TRUE(torch::equal(buffer, expected));
  // The same range on every rank, which is some other rank's slot of the
  // output: through messages (reading it in place would race its writes).
  buffer.fill_(rank);
  auto first_slot = buffer.narrow(0, 0, 1000);
  pg->allgather_into_tensor(buffer, first_slot.clone())->wait();
  EXPECT_TRUE(torch::equal(buffer, expected));
  buffer.fill_(rank);
  pg->allgather_into_tensor(buffer, first_slot)->wait();
  EXPECT_TRUE(torch::equal(buffer, expected));
  // Rank 0 passes a shared input, the others a private one.
  auto shared_input = pg->allocate_collective_buffer(1000, torch::kFloat);
  shared_input.fill_(rank);
  auto private_input = torch::full({1000}, 1.0 * rank);
  auto output = torch::empty({1000 * w});
  pg->allgather_into_tensor(output, rank == 0 ? shared_input : private_input)->wait();
  EXPECT_TRUE(torch::equal(output, expected));
}

TEST(MpiSharedBuffers, SmallCudaAndOptedOutBuffersArePrivate) {
  // Below the threshold, or with it negative, the buffer is ordinary memory
  // (still zero-filled and usable by every collective).
  auto pg = ProcessGroupMPI::create();
  auto small = pg->allocate_collective_buffer(100, torch::kFloat);
  EXPECT_FALSE(pg->is_shared_buffer(small));
  EXPECT_TRUE(torch::equal(small, torch::zeros({100})));
  auto large = pg->allocate_collective_buffer(65536 / 4, torch::kFloat);
  EXPECT_EQ(pg->is_shared_buffer(large), pg->size() > 1);
  auto off = ProcessGroupMPI::create(ProcessGroupMPIOptions().shared_memory_min_bytes(-1));
  auto private_large = off->allocate_collective_buffer(1 << 20, torch::kFloat);
  EXPECT_FALSE(off->is_shared_buffer(private_large));
  EXPECT_FALSE(pg->is_shared_buffer(private_large));
  EXPECT_FALSE(off->is_shared_buffer(large)) << "another group's buffer";
  EXPECT_FALSE(pg->is_shared_buffer(torch::ones({1 << 20})));
  try {
    pg->allocate_collective_buffer(-1, torch::kFloat);
    ADD_FAILURE() << "expected c10::Error for numel -1";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("allocate_collective_buffer: numel must not be negative"),
              std::string::npos)
        << e.what();
  }
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
