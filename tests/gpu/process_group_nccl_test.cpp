// Collectives of the NCCL backend, ranks as threads, one GPU per rank.
//
// Sweep: world size {1, 2, 4} x element count {0, 1, odd, large}; a world
// size needs as many GPUs and is skipped on a machine with fewer, so a
// single-GPU machine runs world size 1. Inside each case every dtype and
// every reduce op that NCCL has. Expected values are in closed form, as in
// tests/comm/gloo/process_group_gloo_test.cpp: rank r contributes r + (i % 5) at
// element i, so SUM = W(W-1)/2 + W(i % 5), AVG = (i % 5) + (W-1)/2, ...
//
// Every test skips with "no CUDA device: NCCL tests need a GPU" on a
// machine without one.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group_nccl.h>
#include <ddp/store/hash_store.h>

#include "gpu/gpu_testing.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp::testing::run_threads;
using ddp_gpu_test::cuda;
using ddp_gpu_test::device_count;

struct Case {
  int world;
  int64_t count;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "W" + std::to_string(info.param.world) + "_N" + std::to_string(info.param.count);
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (int world : {1, 2, 4}) {
    // 0, 1, odd, and large: past NCCL's smallest chunk sizes.
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{(1 << 18) + 3}}) {
      cases.push_back({world, count});
    }
  }
  return cases;
}

// Runs fn(rank, group) on `world` threads, rank r driving cuda:r, all in one
// NCCL group.
void run_nccl_ranks(int world, const std::function<void(int, std::shared_ptr<ProcessGroupNCCL>)>& fn,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const std::string name = ddp_gpu_test::fresh_group_name();
  run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto group = ProcessGroupNCCL::create(
        store, rank, world,
        ProcessGroupNCCLOptions().timeout(timeout).group_name(name).device_index(rank));
    fn(rank, group);
  });
}

at::Tensor pattern(int64_t count) {
  return torch::arange(count, torch::kLong).remainder(5);
}

const std::vector<at::ScalarType> kFloating = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
const std::vector<at::ScalarType> kIntegral = {at::kChar, at::kByte, at::kInt, at::kLong};

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) {
    return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  }
  return {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
}

// Rank r's input for `op` and the closed-form result (on the CPU, as Long or
// Double; the caller converts).
std::pair<at::Tensor, at::Tensor> input_and_expected(ReduceOp op, int rank, int world, int64_t count,
                                                     at::ScalarType dtype) {
  const auto p = pattern(count);
  const int64_t w = world;
  if (dtype == at::kBool) {
    // Rank 0 holds true, every other rank false: SUM and MAX are OR,
    // PRODUCT and MIN are AND.
    auto input = torch::full({count}, rank == 0, torch::kBool);
    const bool expected = (op == ReduceOp::kSum || op == ReduceOp::kMax) ? true : world == 1;
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
    default:
      ADD_FAILURE() << "no closed form for " << to_string(op);
      return {};
  }
}

class NcclSweep : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(GetParam().world);
  }
};

TEST_P(NcclSweep, AllreduceEveryDtypeAndOp) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    std::vector<at::ScalarType> dtypes(kFloating);
    dtypes.insert(dtypes.end(), kIntegral.begin(), kIntegral.end());
    dtypes.push_back(at::kBool);
    for (auto dtype : dtypes) {
      for (auto op : ops_for(dtype)) {
        auto [input, expected] = input_and_expected(op, rank, world, count, dtype);
        auto tensor = input.to(dtype).to(cuda(rank));
        pg->allreduce(tensor, {op})->wait();
        ASSERT_TRUE(torch::equal(tensor.cpu(), expected.to(dtype)))
            << "rank " << rank << " dtype " << dtype << " op " << to_string(op);
      }
    }
  });
}

TEST_P(NcclSweep, AllreduceComplexSumAndAvg) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    // (p + r) + 2(p + r)i summed over ranks, and averaged.
    const auto real = (pattern(count) + rank).to(torch::kFloat);
    auto sum = torch::complex(real, 2 * real).to(cuda(rank));
    auto avg = sum.clone();
    pg->allreduce(sum, {ReduceOp::kSum})->wait();
    pg->allreduce(avg, {ReduceOp::kAvg})->wait();
    const auto real_sum = (pattern(count) * world + world * (world - 1) / 2).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(sum.cpu(), torch::complex(real_sum, 2 * real_sum)));
    const auto real_avg = (pattern(count).to(torch::kFloat) + (world - 1) / 2.0f);
    EXPECT_TRUE(torch::allclose(avg.cpu(), torch::complex(real_avg, 2 * real_avg)));
  });
}

TEST_P(NcclSweep, AllreduceCoalescedMatchesSeparateSums) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    auto a = torch::full({count}, rank + 1.0, cuda(rank));
    auto b = torch::full({2, 3}, 2.0 * rank, cuda(rank));
    pg->allreduce_coalesced({a, b}, {ReduceOp::kSum})->wait();
    EXPECT_TRUE(torch::equal(a.cpu(), torch::full({count}, world * (world + 1) / 2.0)));
    EXPECT_TRUE(torch::equal(b.cpu(), torch::full({2, 3}, 1.0 * world * (world - 1))));
  });
}

TEST_P(NcclSweep, BroadcastFromEveryRootInEveryDtype) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    // Short and ComplexDouble have no NCCL type of their own: they move as bytes.
    for (int root = 0; root < world; ++root) {
      for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kBool, at::kShort,
                         at::kComplexDouble}) {
        auto tensor = (pattern(count) + 10 * rank).to(dtype).to(cuda(rank));
        pg->broadcast(tensor, {root})->wait();
        ASSERT_TRUE(torch::equal(tensor.cpu(), (pattern(count) + 10 * root).to(dtype)))
            << "root " << root << " dtype " << dtype;
      }
    }
  });
}

TEST_P(NcclSweep, ReduceToEveryRoot) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    for (int root = 0; root < world; ++root) {
      auto tensor = (pattern(count) + rank).to(torch::kFloat).to(cuda(rank));
      pg->reduce(tensor, {ReduceOp::kSum, root})->wait();
      if (rank == root) {
        ASSERT_TRUE(torch::equal(tensor.cpu(), (pattern(count) * world + world * (world - 1) / 2).to(torch::kFloat)));
      }
      auto average = (pattern(count) + rank).to(torch::kBFloat16).to(cuda(rank));
      pg->reduce(average, {ReduceOp::kAvg, root})->wait();
      if (rank == root) {
        ASSERT_TRUE(torch::equal(average.cpu(), (pattern(count).to(torch::kDouble) + (world - 1) / 2.0).to(torch::kBFloat16)));
      }
    }
  });
}

TEST_P(NcclSweep, AllgatherBothForms) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    auto input = (pattern(count) + 100 * rank).to(torch::kInt).to(cuda(rank));
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) {
      outputs.push_back(torch::empty({count}, torch::dtype(torch::kInt).device(cuda(rank))));
    }
    pg->allgather(outputs, input)->wait();
    auto flat = torch::empty({world * count}, torch::dtype(torch::kInt).device(cuda(rank)));
    pg->allgather_into_tensor(flat, input)->wait();
    for (int r = 0; r < world; ++r) {
      auto expected = (pattern(count) + 100 * r).to(torch::kInt);
      ASSERT_TRUE(torch::equal(outputs[r].cpu(), expected)) << "from rank " << r;
      ASSERT_TRUE(torch::equal(flat.narrow(0, r * count, count).cpu(), expected)) << "from rank " << r;
    }
  });
}

TEST_P(NcclSweep, GatherAndScatter) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    const int root = world - 1;
    const auto options = torch::dtype(torch::kDouble).device(cuda(rank));
    std::vector<at::Tensor> gathered;
    std::vector<at::Tensor> to_scatter;
    if (rank == root) {
      for (int r = 0; r < world; ++r) {
        gathered.push_back(torch::empty({count}, options));
        to_scatter.push_back((pattern(count) + 1000 * r).to(options));
      }
    }
    auto input = (pattern(count) + 10 * rank).to(options);
    pg->gather(gathered, input, {root})->wait();
    auto output = torch::empty({count}, options);
    pg->scatter(output, to_scatter, {root})->wait();
    if (rank == root) {
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(torch::equal(gathered[r].cpu(), (pattern(count) + 10 * r).to(torch::kDouble))) << "from rank " << r;
      }
    }
    EXPECT_TRUE(torch::equal(output.cpu(), (pattern(count) + 1000 * rank).to(torch::kDouble)));
  });
}

TEST_P(NcclSweep, ReduceScatterSumAndAvg) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    // inputs[r] = p + rank + 10r; rank r receives sum over ranks of inputs[r].
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back((pattern(count) + rank + 10 * r).to(torch::kFloat).to(cuda(rank)));
    }
    auto sum = torch::empty({count}, torch::dtype(torch::kFloat).device(cuda(rank)));
    pg->reduce_scatter(sum, inputs, {ReduceOp::kSum})->wait();
    const auto expected = pattern(count) * world + world * (world - 1) / 2 + 10 * rank * world;
    EXPECT_TRUE(torch::equal(sum.cpu(), expected.to(torch::kFloat)));
    auto avg = torch::empty_like(sum);
    pg->reduce_scatter(avg, inputs, {ReduceOp::kAvg})->wait();
    EXPECT_TRUE(torch::allclose(avg.cpu(), (expected.to(torch::kDouble) / world).to(torch::kFloat)));
    // Uneven chunks (PyTorch's test_reduce_scatter): inputs[i] has i elements
    // on every rank, rank r's output r.
    std::vector<at::Tensor> uneven;
    for (int i = 0; i < world; ++i) {
      uneven.push_back(torch::full({i}, rank + 1.0, torch::dtype(torch::kFloat).device(cuda(rank))));
    }
    auto mine = torch::zeros({rank}, torch::dtype(torch::kFloat).device(cuda(rank)));
    pg->reduce_scatter(mine, uneven)->wait();
    EXPECT_TRUE(torch::equal(mine.cpu(), torch::full({rank}, world * (world + 1) / 2.0, torch::kFloat)));
  });
}

TEST_P(NcclSweep, AlltoallAndPointToPoint) {
  const auto [world, count] = GetParam();
  run_nccl_ranks(world, [&, count = count, world = world](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    // Element j of chunk c on rank r is 100r + 10c + j % 5.
    const auto options = torch::dtype(torch::kLong).device(cuda(rank));
    std::vector<at::Tensor> chunks;
    for (int c = 0; c < world; ++c) {
      chunks.push_back(pattern(count) + 100 * rank + 10 * c);
    }
    auto input = torch::cat(chunks).to(options);
    auto output = torch::empty_like(input);
    pg->alltoall(output, input)->wait();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(torch::equal(output.narrow(0, r * count, count).cpu(), pattern(count) + 100 * r + 10 * rank))
          << "chunk from rank " << r;
    }
    if (world < 2) {
      return;
    }
    // A ring: each rank sends to the next and receives from the previous,
    // posting the send and the receive in an order that cannot deadlock.
    const int next = (rank + 1) % world;
    const int previous = (rank + world - 1) % world;
    auto out = (pattern(count) + rank).to(options);
    auto in = torch::empty_like(out);
    if (rank % 2 == 0) {
      pg->send(out, next)->wait();
      pg->recv(in, previous)->wait();
    } else {
      pg->recv(in, previous)->wait();
      pg->send(out, next)->wait();
    }
    EXPECT_TRUE(torch::equal(in.cpu(), pattern(count) + previous));
  });
}

TEST_P(NcclSweep, BarrierCompletes) {
  const auto [world, count] = GetParam();
  (void)count;
  run_nccl_ranks(world, [](int rank, std::shared_ptr<ProcessGroupNCCL> pg) {
    for (int i = 0; i < 3; ++i) {
      auto work = pg->barrier();
      work->wait();
      EXPECT_TRUE(work->is_success());
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclSweep, ::testing::ValuesIn(sweep()), case_name);

// ---- Misuse: clear errors, on the caller's thread -----------------------------------------

class NcclErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
    group_ = ddp_gpu_test::make_nccl_group_of_one();
  }
  std::shared_ptr<ProcessGroupNCCL> group_;
};

using ddp_gpu_test::message_of;

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in: " << message;
}

TEST_F(NcclErrors, CpuTensorIsRejectedNamingItsDevice) {
  auto message = message_of<c10::Error>([&] { group_->allreduce(torch::ones({4})); });
  expect_contains(message, "[rank 0/1] allreduce: tensor is on device cpu");
  expect_contains(message, "CUDA tensors");
}

TEST_F(NcclErrors, BitwiseOpsNameTheBackendAndSuggestGloo) {
  for (auto op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    auto message = message_of<c10::Error>(
        [&] { group_->allreduce(torch::ones({4}, torch::dtype(torch::kInt).device(cuda())), {op}); });
    expect_contains(message, to_string(op) + " is not supported by the NCCL backend");
    expect_contains(message, "Gloo");
  }
}

TEST_F(NcclErrors, ReductionsNcclCannotDoAreRejected) {
  auto on_gpu = [](at::ScalarType dtype) { return torch::ones({4}, torch::dtype(dtype).device(cuda())); };
  expect_contains(message_of<c10::Error>([&] { group_->allreduce(on_gpu(at::kInt), {ReduceOp::kAvg}); }),
                  "AVG needs a floating-point tensor");
  expect_contains(message_of<c10::Error>([&] { group_->allreduce(on_gpu(at::kBool), {ReduceOp::kAvg}); }),
                  "AVG is not defined for bool");
  expect_contains(message_of<c10::Error>([&] { group_->allreduce(on_gpu(at::kComplexFloat), {ReduceOp::kMax}); }),
                  "not defined for complex");
  expect_contains(message_of<c10::Error>([&] { group_->allreduce(on_gpu(at::kShort)); }),
                  "cannot reduce dtype Short");
}

TEST_F(NcclErrors, ExpandedOutputsAndMismatchedArgumentsAreRejected) {
  // Non-contiguous tensors are taken (Note [Non-contiguous arguments]); an
  // expanded one cannot hold a result.
  auto matrix = torch::arange(16, torch::dtype(torch::kFloat).device(cuda())).reshape({4, 4});
  auto transposed = matrix.t();
  group_->broadcast(transposed)->wait();
  EXPECT_TRUE(torch::equal(matrix.cpu(), torch::arange(16, torch::kFloat).reshape({4, 4})));
  expect_contains(message_of<c10::Error>([&] { group_->broadcast(torch::ones({1}, cuda()).expand({4})); }),
                  "has elements that share memory");
  auto input = torch::ones({4}, cuda());
  auto wrong = torch::empty({5}, cuda());
  expect_contains(message_of<c10::Error>([&] { group_->allgather_into_tensor(wrong, input); }),
                  "expected world size x input elements");
  expect_contains(message_of<c10::Error>([&] { group_->send(input, 0); }), "destination rank 0 is invalid");
}

TEST_F(NcclErrors, MisuseDoesNotConsumeASequenceNumber) {
  auto input = torch::ones({4}, cuda());
  (void)message_of<c10::Error>([&] { group_->allreduce(torch::ones({4})); });
  auto work = group_->allreduce(input);
  work->wait();
  expect_contains(work->name(), "allreduce #0");
}

TEST(NcclTwoDevices, TensorOnAnotherDeviceIsRejectedNamingBoth) {
  DDP_REQUIRE_GPUS(2);
  auto group = ddp_gpu_test::make_nccl_group_of_one();
  group->allreduce(torch::ones({4}, cuda(0)))->wait();
  auto message = message_of<c10::Error>([&] { group->allreduce(torch::ones({4}, cuda(1))); });
  expect_contains(message, "the tensors are on cuda:1, but this process group drives cuda:0");
}

// With one rank there is no fingerprint check (Note [NCCL fingerprint
// check]): an operation that stays pending past the stall delay publishes
// nothing, where a checked one would publish its fingerprint.
TEST(NcclWorldOfOne, ChecksNoFingerprint) {
  DDP_REQUIRE_GPUS(1);
  auto store = std::make_shared<HashStore>();
  const std::string name = ddp_gpu_test::fresh_group_name();
  auto group = ProcessGroupNCCL::create(
      store, 0, 1,
      ProcessGroupNCCLOptions().timeout(std::chrono::seconds(60)).group_name(name).device_index(0));
  auto tensor = torch::ones({16}, cuda());
  group->allreduce(tensor)->wait(std::chrono::seconds(60)); // #0 creates the communicator
  ddp_gpu_test::keep_stream_busy(std::chrono::milliseconds(2000));
  auto work = group->allreduce(tensor); // #1 waits behind the spin
  work->wait(std::chrono::seconds(60));
  EXPECT_TRUE(work->is_success());
  EXPECT_TRUE(tensor.eq(1).all().item<bool>());
  const std::string fingerprints = "ddp/" + name + "/nccl/0/fp/";
  EXPECT_FALSE(store->check({fingerprints + "0/0"}));
  EXPECT_FALSE(store->check({fingerprints + "1/0"}));
}

TEST(NcclAvailability, IsAvailableAndVersion) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_TRUE(ProcessGroupNCCL::is_available());
  const auto version = ProcessGroupNCCL::nccl_version();
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
  const auto group = ddp_gpu_test::make_nccl_group_of_one();
  EXPECT_EQ(group->backend_name(), "nccl");
  EXPECT_TRUE(group->needs_device_buffers()); // the object collectives' bytes go to the GPU
  EXPECT_FALSE(group->reduces_in_shared_memory());
}

} // namespace
} // namespace ddp
