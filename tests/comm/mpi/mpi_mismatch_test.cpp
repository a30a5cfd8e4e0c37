// Ranks that call different collectives at the same point on the MPI
// backend (Note [MPI fingerprint check]): every rank raises
// CollectiveMismatchError naming both calls, before any data moves, and the
// group stays usable.
//
// Usage (tests/comm/mpi/mpi.cmake registers it):
//   DDP_BACKEND=mpi mpirun -np 2 build/tests/mpi_mismatch_test --gtest_brief=1
// Every rank runs every test in the same order on one ProcessGroupMPI.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <string>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_mpi.h>

namespace ddp {
namespace {

ProcessGroup& group() {
  static auto pg = ProcessGroupMPI::create(ProcessGroupMPIOptions().timeout(std::chrono::seconds(30)));
  return *pg;
}

at::Tensor ones(int64_t numel, at::ScalarType dtype = at::kFloat) {
  return torch::ones({numel}, torch::dtype(dtype));
}

// The sequence number of the group's next collective: the tests below are
// the group's only users, and each issues two collectives.
uint64_t next_seq = 0;

// Runs `call` on this rank, expects CollectiveMismatchError whose message
// names both calls (`describe(rank)`: "allreduce|float32[1000] SUM"), then
// checks that a matched allreduce still sums.
void expect_mismatch(const std::function<std::shared_ptr<Work>(int rank)>& call,
                     const std::function<std::string(int rank)>& describe) {
  auto& pg = group();
  ASSERT_EQ(pg.size(), 2) << "run under mpirun -np 2";
  const int rank = pg.rank();
  const int other = 1 - rank;
  const uint64_t seq = next_seq;
  next_seq += 2;
  const auto split = [](const std::string& d) {
    return std::make_pair(d.substr(0, d.find('|')), d.substr(d.find('|') + 1));
  };
  const auto [my_op, my_shape] = split(describe(rank));
  const auto [their_op, their_shape] = split(describe(other));
  const std::string expected =
      c10::str("[rank ", rank, "/2] ", my_op, " #", seq, ": rank ", other, " called ", their_op, " #", seq,
               " with ", their_shape, ", this rank ",
               my_op == their_op ? my_shape : c10::str(my_op, " #", seq, " with ", my_shape));
  try {
    call(rank)->wait();
    ADD_FAILURE() << "no error on rank " << rank;
  } catch (const CollectiveMismatchError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << e.what() << "\nexpected: " << expected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << rank << ": not a CollectiveMismatchError: " << e.what();
  }
  auto t = ones(8);
  pg.allreduce(t)->wait();
  EXPECT_TRUE(t.eq(2).all().item<bool>()) << "the group is unusable after a mismatch: " << t;
}

TEST(MpiMismatch, AllreduceCount1000vs2000) {
  expect_mismatch([](int rank) { return group().allreduce(ones(rank == 0 ? 1000 : 2000)); },
                  [](int rank) { return c10::str("allreduce|float32[", rank == 0 ? 1000 : 2000, "] SUM"); });
}

TEST(MpiMismatch, AllreduceCount1Mvs4M) {
  expect_mismatch([](int rank) { return group().allreduce(ones(rank == 0 ? (1 << 20) : (4 << 20))); },
                  [](int rank) {
                    return c10::str("allreduce|float32[", rank == 0 ? (1 << 20) : (4 << 20), "] SUM");
                  });
}

TEST(MpiMismatch, AllreduceDtypeSameBytes) {
  expect_mismatch([](int rank) { return group().allreduce(ones(1000, rank == 0 ? at::kFloat : at::kInt)); },
                  [](int rank) {
                    return c10::str("allreduce|", rank == 0 ? "float32" : "int32", "[1000] SUM");
                  });
}

TEST(MpiMismatch, AllreduceSumVsMax) {
  expect_mismatch(
      [](int rank) {
        AllreduceOptions options;
        options.op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
        return group().allreduce(ones(1000), options);
      },
      [](int rank) { return c10::str("allreduce|float32[1000] ", rank == 0 ? "SUM" : "MAX"); });
}

TEST(MpiMismatch, BroadcastRoots) {
  expect_mismatch(
      [](int rank) {
        BroadcastOptions options;
        options.root_rank = rank;
        return group().broadcast(ones(1000), options);
      },
      [](int rank) { return c10::str("broadcast|float32[1000] root ", rank); });
}

TEST(MpiMismatch, AllreduceVsBroadcast) {
  expect_mismatch(
      [](int rank) { return rank == 0 ? group().allreduce(ones(1000)) : group().broadcast(ones(1000)); },
      [](int rank) {
        return rank == 0 ? std::string("allreduce|float32[1000] SUM")
                         : std::string("broadcast|float32[1000] root 0");
      });
}

} // namespace
} // namespace ddp
