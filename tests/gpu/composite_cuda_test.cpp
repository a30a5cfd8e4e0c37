// Backend::kAuto on a GPU machine: one group of Gloo for CPU tensors and
// NCCL for CUDA tensors (CompositeProcessGroup), as PyTorch 2.x's
// "cpu:gloo,cuda:nccl". A CPU program keeps working, even with two ranks on
// one GPU (NCCL is never touched), and a CUDA program gets NCCL.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "gpu/gpu_testing.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;
using ddp_gpu_test::message_of;

std::shared_ptr<CompositeProcessGroup> make_composite(std::shared_ptr<Store> store, int rank, int size) {
  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends;
  backends[c10::DeviceType::CPU] = testing::make_gloo_group(store, rank, size);
  backends[c10::DeviceType::CUDA] = ProcessGroupNCCL::create(
      store, rank, size, ProcessGroupNCCLOptions().timeout(std::chrono::seconds(60)).device_index(0));
  return std::make_shared<CompositeProcessGroup>(std::move(backends));
}

TEST(CompositeCuda, RoutesCpuTensorsToGlooAndCudaTensorsToNccl) {
  DDP_REQUIRE_GPUS(1);
  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends;
  backends[c10::DeviceType::CPU] = testing::make_gloo_group_of_one();
  backends[c10::DeviceType::CUDA] = ddp_gpu_test::make_nccl_group_of_one();
  auto group = std::make_shared<CompositeProcessGroup>(std::move(backends));
  EXPECT_EQ(group->backend_name(), "cpu:gloo,cuda:nccl");
  EXPECT_EQ(group->backend_for(c10::DeviceType::CUDA)->backend_name(), "nccl");

  auto on_cpu = torch::full({5}, 2.0);
  group->allreduce(on_cpu)->wait();
  EXPECT_TRUE(torch::equal(on_cpu, torch::full({5}, 2.0)));
  auto on_gpu = torch::full({5}, 3.0, cuda());
  group->allreduce(on_gpu, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(torch::equal(on_gpu.cpu(), torch::full({5}, 3.0)));
  // BOR exists in Gloo only: a CPU tensor gets it, a CUDA tensor is refused
  // by NCCL with a message naming the backend.
  auto bits = torch::full({3}, int64_t{5});
  group->allreduce(bits, {ReduceOp::kBor})->wait();
  EXPECT_NE(message_of<c10::Error>([&] {
              group->allreduce(torch::ones({3}, torch::dtype(torch::kLong).device(cuda())),
                               {ReduceOp::kBor});
            }).find("NCCL"),
            std::string::npos);

  const auto mixed = message_of<c10::Error>([&] {
    group->allgather({torch::empty({2}), torch::empty({2}, cuda())}, torch::ones({2}, cuda()));
  });
  EXPECT_NE(mixed.find("tensors on cpu and cuda:0 in one operation"), std::string::npos) << mixed;
  group->barrier()->wait();
}

TEST(CompositeCuda, TwoRanksOnOneGpuWorkWhileOnlyCpuTensorsAreUsed) {
  DDP_REQUIRE_GPUS(1);
  testing::run_threads(2, [](int rank, std::shared_ptr<Store> store) {
    auto group = make_composite(store, rank, 2);
    auto t = torch::full({4}, rank + 1.0);
    group->allreduce(t)->wait();
    EXPECT_TRUE(torch::equal(t, torch::full({4}, 3.0)));
    group->barrier()->wait();
  });
}

TEST(CompositeCuda, InitProcessGroupAutoPairsGlooWithNcclAndTrainsCpuAndCudaModels) {
  DDP_REQUIRE_GPUS(1);
  auto group = init_process_group(); // no launcher variables: a world of one
  EXPECT_EQ(group->backend_name(), "cpu:gloo,cuda:nccl");
  for (const auto& device : {torch::Device(torch::kCPU), cuda()}) {
    torch::manual_seed(0);
    torch::nn::Linear net(4, 2);
    net->to(device);
    DistributedDataParallel model(net, DistributedDataParallelOptions());
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    const auto before = net->weight.detach().cpu().clone();
    torch::mse_loss(model(torch::ones({3, 4}, device)), torch::zeros({3, 2}, device)).backward();
    optimizer.step();
    EXPECT_FALSE(torch::equal(net->weight.detach().cpu(), before)) << "on " << device;
  }
  destroy_process_group();
}

} // namespace
} // namespace ddp
