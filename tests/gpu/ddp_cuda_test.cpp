// DistributedDataParallel on CUDA at world size 1 over NCCL must train
// exactly like the plain module on the CPU (up to float rounding): the
// gradients go through the NCCL backend's allreduce and the reducer's
// buckets on the GPU. World size 2 runs under ddprun in
// ddp_cuda_parity_main.cpp.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ddp/ddp.h>

#include "gpu/gpu_testing.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;

torch::nn::Sequential make_net() {
  torch::manual_seed(0); // the same weights for the reference and the replica
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
}

std::pair<torch::Tensor, torch::Tensor> batch(int64_t step) {
  torch::manual_seed(100 + step);
  auto x = torch::randn({12, 8});
  auto y = torch::randn({12, 4});
  return {x, y};
}

void expect_same_parameters(torch::nn::Module& reference, torch::nn::Module& trained) {
  auto expected = reference.named_parameters();
  for (const auto& p : trained.named_parameters()) {
    ASSERT_TRUE(expected.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::allclose(p.value().cpu(), expected[p.key()], /*rtol=*/1e-4, /*atol=*/1e-6))
        << p.key() << ": max |difference| "
        << (p.value().cpu() - expected[p.key()]).abs().max().item<double>();
  }
}

class DdpCuda : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
  }
};

TEST_P(DdpCuda, WorldOfOneOverNcclTrainsLikeThePlainModuleOnTheCpu) {
  const bool bucket_view = GetParam();
  auto group = ddp_gpu_test::make_nccl_group_of_one();
  auto reference = make_net();
  auto net = make_net();
  net->to(cuda());
  DistributedDataParallel model(net, DistributedDataParallelOptions()
                                         .process_group(group)
                                         .bucket_cap_mb(0.0001) // several buckets
                                         .first_bucket_cap_mb(0.0001)
                                         .gradient_as_bucket_view(bucket_view));
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  for (int64_t step = 0; step < 5; ++step) {
    auto [x, y] = batch(step);
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    reference_optimizer.step();

    optimizer.zero_grad();
    torch::mse_loss(model(x.to(cuda())), y.to(cuda())).backward();
    optimizer.step();
  }
  expect_same_parameters(*reference, *net);
}

INSTANTIATE_TEST_SUITE_P(BucketView, DdpCuda, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("view") : std::string("copy");
                         });

} // namespace
} // namespace ddp
