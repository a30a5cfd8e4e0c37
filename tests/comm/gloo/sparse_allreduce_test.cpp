// Allreduce of sparse COO tensors on the Gloo backend (Note [Sparse
// allreduce] in src/comm/gloo/process_group_gloo.cpp), ranks as threads over
// a HashStore: world size {1, 2, 3, 4} x entries per rank {0, 1, odd, large}
// x dtype, then the errors, and the answer of supports_sparse_allreduce for
// Gloo and for a composite group.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <tuple>

#include <ddp/comm/process_group_composite.h>
#include <ddp/comm/process_group_gloo.h>

#include "testing/errors.h"
#include "testing/fake_process_group.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp::testing::make_gloo_group;
using ddp::testing::run_threads;

constexpr int64_t kRows = 11;
constexpr int64_t kCols = 3;

// Rank r's tensor, shaped like an Embedding's gradient (sparse in the rows,
// dense in the columns): entry k is row (r + 3k) mod kRows, every column
// (r + 1)(k + 1). With more entries than rows, rows repeat: the tensor is
// not coalesced. Small integers, so that every sum is exact in every dtype.
at::Tensor rank_tensor(int rank, int64_t entries, at::ScalarType dtype) {
  auto rows = (torch::arange(entries, torch::kLong) * 3 + rank).remainder(kRows).reshape({1, -1});
  auto values = ((torch::arange(entries, torch::kDouble) + 1) * (rank + 1))
                    .reshape({-1, 1})
                    .expand({entries, kCols})
                    .contiguous();
  if (dtype == torch::kBool) {
    values = values.gt(0);
  }
  return torch::sparse_coo_tensor(rows, values.to(dtype), {kRows, kCols});
}

// The dense sum over `world` ranks, computed in double.
at::Tensor expected_sum(int world, int64_t entries, at::ScalarType dtype) {
  auto sum = torch::zeros({kRows, kCols}, torch::kDouble);
  for (int r = 0; r < world; ++r) {
    sum += rank_tensor(r, entries, torch::kDouble).to_dense();
  }
  return dtype == torch::kBool ? sum.gt(0) : sum.to(dtype);
}

// (world size, entries per rank, dtype)
using Case = std::tuple<int, int64_t, at::ScalarType>;

class GlooSparseAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(GlooSparseAllreduce, SumsEveryRanksEntriesIntoOneCoalescedTensor) {
  const auto [world, entries, dtype] = GetParam();
  run_threads(world, [&, world = world, entries = entries, dtype = dtype](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, world);
    ASSERT_TRUE(pg->supports_sparse_allreduce(c10::DeviceType::CPU));
    auto t = rank_tensor(rank, entries, dtype);
    auto work = pg->allreduce(t);
    work->wait();
    ASSERT_TRUE(t.is_sparse());
    EXPECT_TRUE(t.is_coalesced());
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_EQ(t.sizes(), (std::vector<int64_t>{kRows, kCols}));
    EXPECT_TRUE(work->result().at(0).is_same(t)) << "the result is not the tensor reduced in place";
    const auto expected = expected_sum(world, entries, dtype);
    EXPECT_TRUE(torch::equal(t.to_dense(), expected))
        << "rank " << rank << ": got\n" << t.to_dense() << "\nexpected\n" << expected;
    // One entry per row that some rank touched.
    EXPECT_EQ(t._nnz(), expected.to(torch::kDouble).abs().sum(1).ne(0).sum().item<int64_t>());
  });
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [world, entries, dtype] = info.param;
  return std::string(c10::toString(dtype)) + "_N" + std::to_string(entries) + "_W" +
         std::to_string(world);
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooSparseAllreduce,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(0, 1, 7, 5003),
                                            ::testing::Values(torch::kFloat, torch::kDouble)),
                         case_name);

INSTANTIATE_TEST_SUITE_P(GlooDtypes, GlooSparseAllreduce,
                         ::testing::Combine(::testing::Values(3), ::testing::Values(7),
                                            ::testing::Values(torch::kHalf, torch::kBFloat16,
                                                              torch::kLong, torch::kInt,
                                                              torch::kByte, torch::kBool)),
                         case_name);

// Some ranks contribute nothing; entries reach every rank all the same.
TEST(GlooSparseAllreduceCases, RanksWithoutEntriesGetTheOthersSum) {
  for (int world : {2, 3, 4}) {
    run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
      auto pg = make_gloo_group(store, rank, world);
      const int64_t entries = rank % 2 == 1 ? 0 : 5;
      auto t = rank_tensor(rank, entries, torch::kFloat);
      pg->allreduce(t)->wait();
      auto expected = torch::zeros({kRows, kCols});
      for (int r = 0; r < world; r += 2) {
        expected += rank_tensor(r, 5, torch::kFloat).to_dense();
      }
      EXPECT_TRUE(torch::equal(t.to_dense(), expected)) << "world " << world << " rank " << rank;
    });
  }
}

// Sparse in every dimension (sparse_dim 2, no dense part), a 3-D tensor
// sparse in two; and every rank ends with the same bits.
TEST(GlooSparseAllreduceCases, AnySparseAndDenseDimensions) {
  constexpr int kWorld = 3;
  run_threads(kWorld, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, kWorld);
    auto dense = torch::zeros({4, 5});
    dense[rank][rank + 1] = 0.25 * (rank + 1);
    dense[3][0] = 1.0 / 3.0;
    auto all_sparse = dense.to_sparse();
    ASSERT_EQ(all_sparse.sparse_dim(), 2);
    pg->allreduce(all_sparse)->wait();
    auto expected = torch::zeros({4, 5});
    for (int r = 0; r < kWorld; ++r) {
      expected[r][r + 1] = 0.25 * (r + 1);
    }
    expected[3][0] = 3 * (1.0f / 3.0f);
    EXPECT_TRUE(torch::allclose(all_sparse.to_dense(), expected, 0, 1e-6));

    auto cube = torch::arange(2 * 3 * 4, torch::kDouble).reshape({2, 3, 4}) * (rank + 1);
    auto sparse_cube = cube.to_sparse(2);
    pg->allreduce(sparse_cube)->wait();
    EXPECT_TRUE(torch::equal(sparse_cube.to_dense(),
                             torch::arange(2 * 3 * 4, torch::kDouble).reshape({2, 3, 4}) * 6));

    // Bits against rank 0's.
    auto values = all_sparse._values().clone();
    pg->broadcast(values, {0})->wait();
    EXPECT_TRUE(torch::equal(values, all_sparse._values()));
  });
}

// A sparse and a dense allreduce issued back to back run in order and both
// complete; the sparse one may be waited on after the dense one.
TEST(GlooSparseAllreduceCases, MixesWithDenseCollectives) {
  constexpr int kWorld = 2;
  run_threads(kWorld, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, kWorld);
    auto sparse = rank_tensor(rank, 7, torch::kFloat);
    auto dense = torch::full({1000}, rank + 1.0);
    auto sparse_work = pg->allreduce(sparse);
    auto dense_work = pg->allreduce(dense);
    auto again = pg->allreduce(sparse); // the same tensor: after the first
    dense_work->wait();
    sparse_work->wait();
    again->wait();
    EXPECT_TRUE(torch::equal(dense, torch::full({1000}, 3.0)));
    EXPECT_TRUE(torch::equal(sparse.to_dense(), expected_sum(kWorld, 7, torch::kFloat) * kWorld));
  });
}

// ---- Errors ------------------------------------------------------------------------

TEST(GlooSparseAllreduceErrors, SparseTensorsOutsideAllreduceSayWhereTheyAreTaken) {
  run_threads(2, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 2);
    const std::string who = "[rank " + std::to_string(rank) + "/2] ";
    auto sparse = rank_tensor(rank, 3, torch::kFloat);
    DDP_EXPECT_ERROR(pg->broadcast(sparse),
                     who + "broadcast: tensor is sparse; the Gloo backend reduces sparse tensors "
                           "only in allreduce");
    DDP_EXPECT_ERROR(pg->reduce(sparse), who + "reduce: tensor is sparse");
    DDP_EXPECT_ERROR(pg->allgather({sparse, sparse}, sparse), who + "allgather: input is sparse");
    DDP_EXPECT_ERROR(pg->send(sparse, 1 - rank), who + "send: tensor is sparse");
    DDP_EXPECT_ERROR(pg->allreduce_coalesced({sparse, sparse}),
                     "allreduce: tensors[0] is sparse; the Gloo backend reduces sparse tensors only "
                     "in allreduce, one tensor per call");
    DDP_EXPECT_ERROR(pg->allreduce(sparse, {ReduceOp::kMax}),
                     who + "allreduce: MAX is not defined for a sparse tensor");
    DDP_EXPECT_ERROR(pg->allreduce(sparse, {ReduceOp::kAvg}), "AVG is not defined for a sparse tensor");
    DDP_EXPECT_ERROR(pg->allreduce(rank_tensor(rank, 3, torch::kComplexFloat)),
                     "allreduce: tensor has dtype ComplexFloat, which the Gloo backend does not support");
    DDP_EXPECT_ERROR(pg->allreduce(torch::eye(3).to_sparse_csr()), "has layout SparseCsr");
    // Nothing was queued: the group is still usable.
    auto t = torch::ones({2});
    pg->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t, torch::full({2}, 2.0)));
  });
}

// Tensors whose sizes differ across ranks: every rank raises the same
// c10::Error from the Work, and the group stays usable.
TEST(GlooSparseAllreduceErrors, SizesThatDifferAcrossRanksFailOnEveryRank) {
  run_threads(3, [&](int rank, std::shared_ptr<Store> store) {
    auto pg = make_gloo_group(store, rank, 3);
    auto other_rows = torch::sparse_coo_tensor(torch::zeros({1, 1}, torch::kLong), torch::ones({1, kCols}),
                                               {rank == 2 ? kRows + 1 : kRows, kCols});
    DDP_EXPECT_ERROR(pg->allreduce(other_rows)->wait(),
                     "allreduce #0: the sparse tensors differ across ranks: rank 2's has sizes [12, 3], "
                     "but rank 0's [11, 3]");
    auto other_dims = rank == 1 ? torch::ones({kRows, kCols}).to_sparse() : rank_tensor(rank, 2, torch::kFloat);
    DDP_EXPECT_ERROR(pg->allreduce(other_dims)->wait(),
                     "allreduce #1: the sparse tensors differ across ranks: rank 1's has 2 dimensions of "
                     "which 2 sparse");
    auto t = torch::ones({2});
    pg->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t, torch::full({2}, 3.0)));
  });
}

// ---- Which groups support it -----------------------------------------------------

// A backend that declares no sparse allreduce, as NCCL and MPI
// (testing/fake_process_group.h): a world of one whose operations complete
// at once.
using DenseOnlyGroup = testing::FakeProcessGroup;

TEST(SparseAllreduceSupport, GlooSaysYesABackendThatDeclaresNothingSaysNo) {
  auto gloo = ddp::testing::make_gloo_group_of_one();
  EXPECT_TRUE(gloo->supports_sparse_allreduce(c10::DeviceType::CPU));
  EXPECT_TRUE(gloo->supports_sparse_allreduce(c10::DeviceType::CUDA)); // staged through the host
  DenseOnlyGroup fake;
  EXPECT_FALSE(fake.supports_sparse_allreduce(c10::DeviceType::CPU));
}

// The composite group answers for the backend of each device type, and
// routes a CPU sparse allreduce to Gloo.
TEST(SparseAllreduceSupport, CompositeAnswersForTheBackendOfTheDevice) {
  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends;
  backends[c10::DeviceType::CPU] = ddp::testing::make_gloo_group_of_one();
  backends[c10::DeviceType::Meta] = std::make_shared<DenseOnlyGroup>();
  CompositeProcessGroup group(std::move(backends));
  EXPECT_TRUE(group.supports_sparse_allreduce(c10::DeviceType::CPU));
  EXPECT_FALSE(group.supports_sparse_allreduce(c10::DeviceType::Meta));
  EXPECT_FALSE(group.supports_sparse_allreduce(c10::DeviceType::CUDA)); // no backend for it
  auto t = rank_tensor(0, 7, torch::kFloat);
  group.allreduce(t)->wait();
  EXPECT_TRUE(t.is_coalesced());
  EXPECT_TRUE(torch::equal(t.to_dense(), expected_sum(1, 7, torch::kFloat)));
}

} // namespace
} // namespace ddp
