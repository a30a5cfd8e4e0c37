// The fake backend (include/ddp/comm/process_group_fake.h): outputs as if
// every rank held this rank's inputs, the bytes each collective would have
// sent, the same argument checks as the real backends, meta tensors, and
// DDP, ZeRO and FSDP run as one rank of a large world in one process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <chrono>

#include <ddp/ddp.h>

#include "comm/fake/fake_link.h"
#include "testing/errors.h"

namespace ddp {
namespace {

int64_t sent(const FakeProcessGroup& group, const std::string& op) {
  const auto traffic = group.traffic();
  const auto it = traffic.find(op);
  return it == traffic.end() ? 0 : it->second.bytes_sent;
}

TEST(FakeProcessGroup, ReductionsAreThoseOfRanksHoldingTheSameTensor) {
  auto group = FakeProcessGroup::create(1, 4);
  EXPECT_EQ(group->backend_name(), "fake");
  auto t = torch::tensor({1.0f, 2.0f, 3.0f});
  group->allreduce(t)->wait();
  EXPECT_TRUE(t.equal(torch::tensor({4.0f, 8.0f, 12.0f})));
  group->allreduce(t, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(t.equal(torch::tensor({4.0f, 8.0f, 12.0f})));
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    group->allreduce(t, {op})->wait();
    EXPECT_TRUE(t.equal(torch::tensor({4.0f, 8.0f, 12.0f}))) << to_string(op);
  }
  auto p = torch::tensor({2, 3}, torch::kLong);
  group->allreduce(p, {ReduceOp::kProduct})->wait();
  EXPECT_TRUE(p.equal(torch::tensor({16, 81}, torch::kLong)));
  group->allreduce(p, {ReduceOp::kBxor})->wait(); // an even number of equal values
  EXPECT_TRUE(p.equal(torch::zeros({2}, torch::kLong)));
  auto flags = torch::tensor({true, false});
  group->allreduce(flags)->wait(); // a bool SUM is an OR
  EXPECT_TRUE(flags.equal(torch::tensor({true, false})));

  // reduce: the root's tensor reduced, the others' left.
  auto root = torch::ones({2});
  group->reduce(root, {ReduceOp::kSum, 1})->wait();
  EXPECT_TRUE(root.equal(torch::full({2}, 4.0f)));
  auto other = torch::ones({2});
  group->reduce(other, {ReduceOp::kSum, 0})->wait();
  EXPECT_TRUE(other.equal(torch::ones({2})));

  // reduce_scatter: this rank's chunk, reduced over 4 equal ones.
  auto out = torch::zeros({2});
  group->reduce_scatter(out, {torch::full({2}, 1.0f), torch::full({2}, 2.0f), torch::full({2}, 3.0f),
                              torch::full({2}, 4.0f)})
      ->wait();
  EXPECT_TRUE(out.equal(torch::full({2}, 8.0f)));

  // Complex tensors as the real backends take them: SUM and AVG on the
  // real and imaginary parts, the other reductions refused.
  auto z = torch::complex(torch::tensor({1.0f, 2.0f}), torch::tensor({-1.0f, 0.5f}));
  group->allreduce(z)->wait();
  EXPECT_TRUE(z.equal(torch::complex(torch::tensor({4.0f, 8.0f}), torch::tensor({-4.0f, 2.0f}))));
  group->allreduce(z, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(z.equal(torch::complex(torch::tensor({4.0f, 8.0f}), torch::tensor({-4.0f, 2.0f}))));
  EXPECT_NE(testing::error_of([&] { group->allreduce(z, {ReduceOp::kMax}); })
                .find("[rank 1/4] allreduce: MAX is not defined for complex dtype ComplexFloat; only SUM and AVG are"),
            std::string::npos);
}

TEST(FakeProcessGroup, GathersRepeatThisRanksInput) {
  auto group = FakeProcessGroup::create(2, 3);
  const auto input = torch::tensor({5.0f, 6.0f});
  std::vector<at::Tensor> outputs{torch::zeros({2}), torch::zeros({2}), torch::zeros({2})};
  group->allgather(outputs, input)->wait();
  for (const auto& o : outputs) {
    EXPECT_TRUE(o.equal(input));
  }
  auto flat = torch::zeros({6});
  group->allgather_into_tensor(flat, input)->wait();
  EXPECT_TRUE(flat.equal(torch::tensor({5.0f, 6.0f, 5.0f, 6.0f, 5.0f, 6.0f})));
  // A non-contiguous output gets the same.
  auto wide = torch::zeros({6, 2});
  auto column = wide.select(1, 1);
  group->allgather_into_tensor(column, input)->wait();
  EXPECT_TRUE(column.equal(flat));
  // gather on the root; a non-root passes no outputs.
  std::vector<at::Tensor> gathered{torch::zeros({2}), torch::zeros({2}), torch::zeros({2})};
  group->gather(gathered, input, {2})->wait();
  EXPECT_TRUE(gathered[0].equal(input));
  group->gather({}, input, {0})->wait();
  // scatter from this rank: its own chunk.
  auto scattered = torch::zeros({2});
  group->scatter(scattered, {torch::ones({2}), torch::full({2}, 2.0f), torch::full({2}, 3.0f)}, {2})->wait();
  EXPECT_TRUE(scattered.equal(torch::full({2}, 3.0f)));
  // broadcast and recv leave the tensor as it was.
  auto kept = torch::tensor({7.0f});
  group->broadcast(kept, {0})->wait();
  group->recv(kept, 0)->wait();
  EXPECT_TRUE(kept.equal(torch::tensor({7.0f})));
}

TEST(FakeProcessGroup, AlltoallReceivesWhatThisRankSendsItself) {
  auto group = FakeProcessGroup::create(1, 3);
  auto output = torch::zeros({3});
  group->alltoall(output, torch::tensor({10.0f, 11.0f, 12.0f}))->wait();
  EXPECT_TRUE(output.equal(torch::full({3}, 11.0f)));
  // Uneven: this rank sends itself 2 rows; peers whose chunk has another
  // size leave theirs as it was.
  AlltoallOptions options;
  options.input_split_sizes = {1, 2, 1};
  options.output_split_sizes = {2, 2, 3};
  auto uneven = torch::full({7}, -1.0f);
  group->alltoall(uneven, torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}), options)->wait();
  EXPECT_TRUE(uneven.equal(torch::tensor({2.0f, 3.0f, 2.0f, 3.0f, -1.0f, -1.0f, -1.0f})));
  EXPECT_EQ(sent(*group, "alltoall"), (2 + 2) * 4); // 2 elements to the others, then 2
}

TEST(FakeProcessGroup, CountsTheBytesEachRankWouldSend) {
  auto group = FakeProcessGroup::create(1, 4);
  const auto t = torch::zeros({1000}); // 4000 bytes
  group->allreduce(t)->wait();
  EXPECT_EQ(sent(*group, "allreduce"), 2 * 3 * 4000 / 4);
  group->allreduce_coalesced({torch::zeros({100}), torch::zeros({300})})->wait();
  EXPECT_EQ(sent(*group, "allreduce_coalesced"), 2 * 3 * 1600 / 4);
  std::vector<at::Tensor> outputs(4, torch::zeros({1000}));
  for (auto& o : outputs) {
    o = torch::zeros({1000});
  }
  group->allgather(outputs, t)->wait();
  EXPECT_EQ(sent(*group, "allgather"), 3 * 4000);
  group->allgather_into_tensor(torch::zeros({4000}), t)->wait();
  EXPECT_EQ(sent(*group, "allgather_into_tensor"), 3 * 4000);
  group->reduce_scatter(torch::zeros({1000}), outputs)->wait();
  EXPECT_EQ(sent(*group, "reduce_scatter"), 3 * 4000);
  group->broadcast(t, {2})->wait(); // the chain 2, 3, 0, 1: rank 1 is last
  EXPECT_EQ(sent(*group, "broadcast"), 0);
  group->broadcast(t, {0})->wait(); // 0, 1, 2, 3: rank 1 forwards
  EXPECT_EQ(sent(*group, "broadcast"), 4000);
  group->reduce(t, {ReduceOp::kSum, 1})->wait(); // the root receives
  EXPECT_EQ(sent(*group, "reduce"), 0);
  group->gather({}, t, {0})->wait();
  EXPECT_EQ(sent(*group, "gather"), 4000);
  group->send(t, 3)->wait();
  EXPECT_EQ(sent(*group, "send"), 4000);
  group->recv(t, 3)->wait();
  group->barrier()->wait();
  EXPECT_EQ(sent(*group, "recv") + sent(*group, "barrier"), 0);
  const auto traffic = group->traffic();
  EXPECT_EQ(traffic.at("broadcast").calls, 2);
  EXPECT_EQ(traffic.at("barrier").calls, 1);
  EXPECT_EQ(group->bytes_sent(), 6000 + 2400 + 12000 + 12000 + 12000 + 4000 + 4000 + 4000);
  group->reset_traffic();
  EXPECT_EQ(group->bytes_sent(), 0);
  EXPECT_TRUE(group->traffic().empty());

  // Alone, nothing is sent.
  auto alone = FakeProcessGroup::create(0, 1);
  alone->allreduce(t)->wait();
  EXPECT_EQ(alone->bytes_sent(), 0);
}

TEST(FakeProcessGroup, ChecksArgumentsAsTheRealBackends) {
  auto group = FakeProcessGroup::create(0, 4);
  const auto t = torch::zeros({4});
  EXPECT_THROW(group->allgather({torch::zeros({4})}, t), c10::Error);     // one output, not 4
  EXPECT_THROW(group->allgather_into_tensor(torch::zeros({8}), t), c10::Error);
  EXPECT_THROW(group->allreduce(torch::zeros({2}, torch::kLong), {ReduceOp::kAvg}), c10::Error);
  EXPECT_THROW(group->allreduce(t, {ReduceOp::kBand}), c10::Error);
  EXPECT_THROW(group->broadcast(t, {4}), c10::Error);
  EXPECT_THROW(group->send(t, 0), c10::Error); // to itself
  EXPECT_THROW(group->allreduce(at::Tensor()), c10::Error);
  try {
    FakeProcessGroup::create(4, 4);
    ADD_FAILURE() << "rank 4 of 4 was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("rank 4 is out of range for world size 4"), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(FakeProcessGroup, TakesMetaTensors) {
  auto group = FakeProcessGroup::create(3, 1024);
  const auto shard = torch::empty({1000}, torch::TensorOptions().device(torch::kMeta));
  auto full = torch::empty({1024 * 1000}, torch::TensorOptions().device(torch::kMeta));
  group->allgather_into_tensor(full, shard)->wait();
  group->allreduce(full)->wait();
  group->reduce_scatter(shard, std::vector<at::Tensor>(1024, shard))->wait();
  EXPECT_EQ(sent(*group, "allgather_into_tensor"), 1023 * 4000);
  EXPECT_EQ(sent(*group, "allreduce"), 2 * 1023 * int64_t{4096000} / 1024);
}

// One rank of 8, in one process: the gradients are a single process's (every
// rank holds the same batch), and the step sends 2 (W - 1) / W of them.
TEST(FakeProcessGroup, DdpStepAsOneRankOfEight) {
  auto group = FakeProcessGroup::create(3, 8);
  torch::manual_seed(0);
  auto net = torch::nn::Sequential(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 8));
  torch::manual_seed(0);
  auto reference = torch::nn::Sequential(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 8));
  DistributedDataParallel model(net, DistributedDataParallelOptions().process_group(group));
  group->reset_traffic();
  const auto x = torch::randn({16, 64});
  model(x).square().mean().backward();
  reference->forward(x).square().mean().backward();
  int64_t grad_bytes = 0;
  const auto ours = net->parameters();
  const auto theirs = reference->parameters();
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ours[i].grad(), theirs[i].grad(), 1e-6, 1e-7)) << "parameter " << i;
    grad_bytes += static_cast<int64_t>(ours[i].nbytes());
  }
  // Each bucket's share rounds down: at most a byte per bucket below.
  EXPECT_LE(group->bytes_sent(), 2 * 7 * grad_bytes / 8);
  EXPECT_GE(group->bytes_sent(), 2 * 7 * grad_bytes / 8 - 8);
}

// FSDP at a world of 1024 in one process: each rank keeps 1/1024 of each
// unit, and one step gathers each unit twice (forward, backward) and
// reduce-scatters its gradient once.
TEST(FakeProcessGroup, FsdpStepAsOneRankOf1024) {
  auto group = FakeProcessGroup::create(5, 1024);
  // A Sequential's children with parameters are its units.
  torch::nn::Sequential net(torch::nn::Linear(128, 128), torch::nn::Tanh(), torch::nn::Linear(128, 128),
                            torch::nn::Tanh(), torch::nn::Linear(128, 128));
  FullyShardedDataParallel model(net, FullyShardedDataParallelOptions().process_group(group));
  ASSERT_EQ(model->num_units(), 3u);
  const int64_t unit = 128 * 128 + 128;
  const int64_t shard = (unit + 1023) / 1024;
  int64_t local = 0;
  for (const auto& p : model->parameters()) {
    local += p.numel();
  }
  EXPECT_EQ(local, 3 * shard);
  group->reset_traffic();
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  model(torch::randn({4, 128})).sum().backward();
  optimizer.step();
  const auto traffic = group->traffic();
  ASSERT_EQ(traffic.count("allgather_into_tensor"), 1u);
  EXPECT_EQ(traffic.at("allgather_into_tensor").bytes_sent,
            traffic.at("allgather_into_tensor").calls * 1023 * shard * 4);
  EXPECT_GE(traffic.at("allgather_into_tensor").calls, 3);
  ASSERT_EQ(traffic.count("reduce_scatter"), 1u);
  EXPECT_EQ(traffic.at("reduce_scatter").calls, 3);
  EXPECT_EQ(traffic.at("reduce_scatter").bytes_sent, 3 * 1023 * shard * 4);
}

TEST(FakeProcessGroup, ZeroStepAsOneRankOfFour) {
  auto group = FakeProcessGroup::create(2, 4);
  auto net = torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::Linear(32, 32), torch::nn::Linear(32, 32),
                                    torch::nn::Linear(32, 4));
  DistributedDataParallel model(net, DistributedDataParallelOptions().process_group(group));
  optim::ZeroRedundancyOptimizer<torch::optim::Adam> optimizer(
      model->parameters(), torch::optim::AdamOptions(1e-3), optim::ZeroRedundancyOptimizerOptions().process_group(group));
  group->reset_traffic();
  model(torch::randn({8, 32})).sum().backward();
  optimizer.step();
  EXPECT_GT(sent(*group, "allreduce"), 0);
  // The updated parameters go out from their owners: this rank sends what it
  // owns and forwards the rest along the broadcast chains.
  EXPECT_GT(group->traffic().count("broadcast") + group->traffic().count("allgather_into_tensor"), 0u);
}

// DDP_BACKEND=fake: init_process_group makes rank RANK of WORLD_SIZE with no
// MASTER_ADDR, and new_group makes fake subgroups without meeting anyone.
TEST(FakeProcessGroup, InitProcessGroupFromTheEnvironment) {
  ::setenv("DDP_BACKEND", "fake", 1);
  ::setenv("RANK", "600", 1);
  ::setenv("WORLD_SIZE", "1024", 1);
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  auto group = init_process_group();
  EXPECT_EQ(group->backend_name(), "fake");
  EXPECT_EQ(group->rank(), 600);
  EXPECT_EQ(group->size(), 1024);
  std::vector<int> low(512), high(512);
  for (int i = 0; i < 512; ++i) {
    low[static_cast<size_t>(i)] = i;
    high[static_cast<size_t>(i)] = 512 + i;
  }
  auto outside = new_group(low);
  auto inside = new_group(high);
  EXPECT_FALSE(is_member(outside));
  ASSERT_TRUE(is_member(inside));
  EXPECT_EQ(inside->backend_name(), "fake");
  EXPECT_EQ(inside->rank(), 88);
  EXPECT_EQ(inside->size(), 512);
  destroy_process_group();
  ::unsetenv("DDP_BACKEND");
  // Or asked for by name, whatever DDP_BACKEND says.
  auto named = init_process_group(InitOptions().backend(Backend::kFake));
  EXPECT_EQ(named->rank(), 600);
  EXPECT_EQ(to_string(Backend::kFake), "fake");
  destroy_process_group();
  // Without RANK and WORLD_SIZE, the fake backend does not guess the world.
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  try {
    init_process_group(InitOptions().backend(Backend::kFake));
    ADD_FAILURE() << "the fake backend started without RANK and WORLD_SIZE";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("fake backend's environment does not describe a valid world"), std::string::npos)
        << message;
    EXPECT_NE(message.find("RANK and WORLD_SIZE"), std::string::npos) << message;
  }
  EXPECT_FALSE(is_initialized());
}

// Note [Shared buffers in the fake]: with DDP_FAKE_SHM=1 the fake shares
// buffers where Gloo would, from LOCAL_WORLD_SIZE's layout: among ranks on
// one host, or on hosts that hold the same number (two or more) of them;
// common buffers on one host only; large CPU buffers only.
TEST(FakeProcessGroup, SharesBuffersWhereGlooWould) {
  const auto big = torch::TensorOptions().dtype(torch::kFloat);
  const int64_t numel = 1 << 14; // 64 KiB: Gloo's shared_memory_min_bytes
  ::unsetenv("DDP_FAKE_LINK");
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::unsetenv("DDP_FAKE_SHM");
  {
    // By default nothing is shared.
    auto group = FakeProcessGroup::create(1, 2);
    EXPECT_FALSE(group->reduces_in_shared_memory());
    EXPECT_FALSE(group->is_shared_buffer(group->allocate_collective_buffer(numel, big)));
    EXPECT_FALSE(group->allocate_common_buffer(numel, big).defined());
  }
  ::setenv("DDP_FAKE_SHM", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  {
    // Rank 1 of 2, one host: collective and common buffers, zero-filled.
    auto group = FakeProcessGroup::create(1, 2);
    EXPECT_TRUE(group->reduces_in_shared_memory());
    const auto bucket = group->allocate_collective_buffer(numel, big);
    ASSERT_EQ(bucket.numel(), numel);
    EXPECT_TRUE(group->is_shared_buffer(bucket));
    EXPECT_TRUE(group->is_shared_buffer(bucket.narrow(0, numel / 2, 10)));
    EXPECT_TRUE(bucket.eq(0).all().item<bool>());
    EXPECT_FALSE(group->is_shared_buffer(torch::zeros({numel})));
    // Below 64 KiB, or not on the CPU: private.
    EXPECT_FALSE(group->is_shared_buffer(group->allocate_collective_buffer(numel - 1, big)));
    EXPECT_FALSE(group->is_shared_buffer(group->allocate_collective_buffer(numel, big.device(torch::kMeta))));
    const auto common = group->allocate_common_buffer(numel, big);
    ASSERT_TRUE(common.defined());
    EXPECT_EQ(common.numel(), numel);
    EXPECT_TRUE(group->is_shared_buffer(common));
    EXPECT_FALSE(group->allocate_common_buffer(numel - 1, big).defined());
  }
  {
    // 8 ranks on 4 hosts of 2: shared buffers, no common ones.
    auto group = FakeProcessGroup::create(3, 8);
    EXPECT_TRUE(group->is_shared_buffer(group->allocate_collective_buffer(numel, big)));
    EXPECT_FALSE(group->allocate_common_buffer(numel, big).defined());
  }
  {
    // 8 ranks on hosts of 3, 3 and 2 (uneven): nothing shared, as on Gloo.
    ::setenv("LOCAL_WORLD_SIZE", "3", 1);
    auto group = FakeProcessGroup::create(3, 8);
    EXPECT_FALSE(group->is_shared_buffer(group->allocate_collective_buffer(numel, big)));
    EXPECT_FALSE(group->allocate_common_buffer(numel, big).defined());
  }
  {
    // One rank a host: nothing to share.
    ::setenv("LOCAL_WORLD_SIZE", "1", 1);
    auto group = FakeProcessGroup::create(3, 4);
    EXPECT_FALSE(group->is_shared_buffer(group->allocate_collective_buffer(numel, big)));
  }
  {
    // Subgroups by their world ranks: HSDP's shard group within a host
    // shares a common buffer, its replicate group across hosts none.
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::setenv("DDP_BACKEND", "fake", 1);
    ::setenv("RANK", "3", 1);
    ::setenv("WORLD_SIZE", "8", 1);
    init_process_group();
    auto shard = new_group({2, 3});
    auto replicate = new_group({1, 3, 5, 7});
    EXPECT_TRUE(shard->allocate_common_buffer(numel, big).defined());
    EXPECT_FALSE(replicate->allocate_common_buffer(numel, big).defined());
    EXPECT_FALSE(replicate->is_shared_buffer(replicate->allocate_collective_buffer(numel, big)));
    destroy_process_group();
    ::unsetenv("DDP_BACKEND");
    ::unsetenv("RANK");
    ::unsetenv("WORLD_SIZE");
  }
  // A value that is neither 0 nor 1, and no layout: errors naming them.
  ::setenv("DDP_FAKE_SHM", "yes", 1);
  DDP_EXPECT_ERROR(FakeProcessGroup::create(0, 2), "DDP_FAKE_SHM must be 0 or 1 (got 'yes')");
  ::setenv("DDP_FAKE_SHM", "1", 1);
  ::unsetenv("LOCAL_WORLD_SIZE");
  DDP_EXPECT_ERROR(FakeProcessGroup::create(0, 2), "set LOCAL_WORLD_SIZE");
  ::unsetenv("DDP_FAKE_SHM");
}

// FSDP on a fake group of one host with DDP_FAKE_SHM=1 takes a real Gloo
// job's paths: each unit gathered in common memory (a barrier, no
// all-gather) and its gradients reduce-scattered in a shared buffer.
TEST(FakeProcessGroup, FsdpGathersInCommonMemoryWithSharedBuffers) {
  ::unsetenv("DDP_FAKE_LINK");
  ::setenv("DDP_FAKE_SHM", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  auto group = FakeProcessGroup::create(1, 2);
  ::unsetenv("DDP_FAKE_SHM");
  ::unsetenv("LOCAL_WORLD_SIZE");
  torch::nn::Sequential net(torch::nn::Linear(256, 256), torch::nn::Tanh(), torch::nn::Linear(256, 256));
  FullyShardedDataParallel model(net, FullyShardedDataParallelOptions().process_group(group));
  ASSERT_EQ(model->num_units(), 2u);
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(group->is_shared_buffer(p)) << "a shard outside the common buffer";
  }
  group->reset_traffic();
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  model(torch::randn({4, 256})).sum().backward();
  optimizer.step();
  const auto traffic = group->traffic();
  EXPECT_EQ(traffic.count("allgather_into_tensor"), 0u);
  ASSERT_EQ(traffic.count("barrier"), 1u);
  EXPECT_GE(traffic.at("barrier").calls, 2);
  ASSERT_EQ(traffic.count("reduce_scatter"), 1u);
  EXPECT_EQ(traffic.at("reduce_scatter").calls, 2);
}

// Note [A simulated link]: an operation's cost is the cost model's
// (bench/scaling/cost_model.py gives the same figures: 0.30394 s and a
// machine-wide 0.30199 s of CPU over 2 cores for the allreduce of the
// world, in shared memory within each host; 0.27064 s and 0.15603 s for the
// ring of an uneven group; the broadcast's below).
TEST(FakeLink, PricesOperationsAsTheCostModelDoes) {
  internal::FakeLink link;
  link.bandwidth = 0.995e9 / 8;
  link.latency = 214e-6;
  link.per_host = 2;
  link.cpu_ns_link = 4.0;
  link.cpu_ns_loopback = 1.3;
  const int64_t n = 25165824;
  const std::vector<int> world{0, 1, 2, 3, 4, 5, 6, 7};
  // Two ranks on each of four hosts: reduced within each host in shared
  // memory, among the hosts by a reduce-scatter and an all-gather (Note
  // [Reduced among hosts]): two latencies, 3/4 of the buffer per link.
  const auto shared = internal::fake_call_cost(link, "allreduce", 2 * 7 * n / 8, n, world, 8);
  EXPECT_NEAR(shared.network_s, 0.30394, 1e-4);
  EXPECT_NEAR(shared.network_s, 2 * 214e-6 + 1.5 * n / link.bandwidth, 1e-9);
  EXPECT_NEAR(shared.cpu_s, 0.30199 * 2 / 8, 1e-4); // this rank's share
  // Gloo's binomial broadcast, averaged over the roots: with an even root
  // the first round stays within a host, then two ranks of a host send
  // across its link in each of the two other rounds (4 tensors' time);
  // with an odd root every round crosses (cost_model.py: 0.80989 s, and
  // 0.33533 s of the machine's CPU over 2 cores).
  const auto tree = internal::fake_call_cost(link, "broadcast", n, n, world, 8);
  EXPECT_NEAR(tree.network_s, 0.80989, 1e-4);
  EXPECT_NEAR(tree.network_s, 2.5 * 214e-6 + 4.0 * n / link.bandwidth, 1e-9);
  EXPECT_NEAR(tree.cpu_s, 0.33533 * 2 / 8, 1e-4);
  // Uneven hosts (two ranks and one): Gloo's ring over TCP.
  const auto ring = internal::fake_call_cost(link, "allreduce", 2 * 2 * n / 3, n, {0, 1, 2}, 8);
  EXPECT_NEAR(ring.network_s, 0.27064, 1e-4);
  EXPECT_NEAR(ring.cpu_s, 0.15603 * 2 / 3, 1e-4); // one of 8 / 3 groups alike, a third of its CPU
  // Within one host: nothing.
  const auto local = internal::fake_call_cost(link, "allreduce", n, n, {2, 3}, 8);
  EXPECT_EQ(local.network_s, 0);
  EXPECT_EQ(local.cpu_s, 0);
  // A small allreduce is Gloo's exchange: one latency and every rank's
  // buffer to every other host's ranks.
  const auto small = internal::fake_call_cost(link, "allreduce", 2 * 7 * 4096 / 8, 4096, world, 8);
  EXPECT_NEAR(small.network_s, 214e-6 + 2.0 * 6 * 4096 / link.bandwidth, 1e-9);
  // HSDP's replicate groups (one rank per host, two such groups per host)
  // share the host's link.
  const auto replicate = internal::fake_call_cost(link, "allreduce", 3 * n / 2, n, {0, 2, 4, 6}, 8);
  EXPECT_NEAR(replicate.network_s, 6 * 214e-6 + 2 * (3.0 * n / 2) / link.bandwidth, 1e-9);
}

TEST(FakeLink, ReadsItsSettingsAndNamesAWrongOne) {
  ::setenv("DDP_FAKE_LINK", "gbit=10,latency_us=1000,per_host=4,cpu_ns_link=2.5", 1);
  auto link = internal::fake_link_from_env();
  ASSERT_TRUE(link.has_value());
  EXPECT_DOUBLE_EQ(link->bandwidth, 10e9 / 8);
  EXPECT_DOUBLE_EQ(link->latency, 1e-3);
  EXPECT_EQ(link->per_host, 4);
  EXPECT_DOUBLE_EQ(link->cpu_ns_link, 2.5);
  EXPECT_DOUBLE_EQ(link->cpu_ns_loopback, 0);
  for (const auto& [value, expected] : std::vector<std::pair<std::string, std::string>>{
           {"gbit=fast,latency_us=1", "gbit takes a number >= 0 (got 'fast')"},
           {"gbit=1", "gbit and latency_us are required"},
           {"gbit=1,latency_us=1,speed=2", "unknown key 'speed'"},
           {"gbit=1,latency_us=1,per_host=1.5", "per_host takes a whole number >= 1"},
           {"gbit=1;latency_us=1", "gbit takes a number >= 0 (got '1;latency_us=1')"},
           {"gbit=1,latency", "'latency' is not key=value"}}) {
    ::setenv("DDP_FAKE_LINK", value.c_str(), 1);
    try {
      internal::fake_link_from_env();
      ADD_FAILURE() << "accepted DDP_FAKE_LINK=" << value;
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("DDP_FAKE_LINK"), std::string::npos) << message;
      EXPECT_NE(message.find(expected), std::string::npos) << message;
    }
  }
  // A group made with a malformed one says which rank it is.
  ::setenv("DDP_FAKE_LINK", "gbit=1", 1);
  try {
    FakeProcessGroup::create(1, 4);
    ADD_FAILURE() << "a fake group took DDP_FAKE_LINK=gbit=1";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("[rank 1/4] fake group: DDP_FAKE_LINK: gbit and latency_us are required"),
              std::string::npos)
        << message;
  }
  ::unsetenv("DDP_FAKE_LINK");
  EXPECT_FALSE(internal::fake_link_from_env().has_value());
}

// With DDP_FAKE_LINK, an operation completes after its simulated time, in
// issue order, its outputs those of the fake; callbacks run then.
TEST(FakeLink, OperationsCompleteAfterTheirTimeInIssueOrder) {
  ::setenv("DDP_FAKE_LINK", "gbit=0.008,latency_us=0,per_host=1", 1); // 1 MB/s
  ::setenv("WORLD_SIZE", "2", 1);
  auto group = FakeProcessGroup::create(0, 2);
  ::unsetenv("DDP_FAKE_LINK");
  ::unsetenv("WORLD_SIZE");
  auto first = torch::ones({50000}); // 200 kB: a ring allreduce sends them all, 0.2 s
  auto second = torch::ones({25000}); // 0.1 s more
  const auto start = std::chrono::steady_clock::now();
  auto a = group->allreduce(first);
  auto b = group->allreduce(second);
  bool called = false;
  auto c = b->then([&](const std::vector<at::Tensor>& result) {
    called = true;
    return result;
  });
  EXPECT_FALSE(b->is_completed());
  a->wait();
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(first_s, 0.19);
  EXPECT_TRUE(first.equal(torch::full({50000}, 2.0f)));
  c->wait();
  const double both_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(both_s, 0.29);
  EXPECT_LT(both_s, 5.0);
  EXPECT_TRUE(called);
  EXPECT_TRUE(b->result()[0].equal(torch::full({25000}, 2.0f)));
  // A group destroyed with operations queued completes them at once.
  auto last = group->allreduce(torch::ones({1000000})); // 4 s
  group.reset();
  EXPECT_TRUE(last->is_completed());
}

} // namespace
} // namespace ddp
