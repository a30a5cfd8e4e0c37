// DistributedDataParallel in one process, without a launcher: the error for
// a missing process group, option errors, and a world of size 1. The
// multi-rank behaviour is tested by the programs run under ddprun
// (tests/nn/*_main.cpp).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <string>

#include <ddp/ddp.h>

#include "nn/closed_form.h"

#include "testing/errors.h"

namespace ddp {
namespace {

using ddp::testing::error_of;

const char* const kLauncherVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                     "MASTER_ADDR", "MASTER_PORT"};

class DistributedDataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* var : kLauncherVars) {
      ::unsetenv(var);
    }
    destroy_process_group();
  }
  void TearDown() override {
    destroy_process_group();
  }
};

TEST_F(DistributedDataParallelTest, BeforeInitProcessGroupSaysToCallIt) {
  ASSERT_FALSE(is_initialized());
  auto net = ddp_test::make_closed_form_mlp();
  const auto message = error_of([&] { DistributedDataParallel model(net); });
  EXPECT_NE(message.find("init_process_group"), std::string::npos) << message;
}

TEST_F(DistributedDataParallelTest, NonPositiveBucketCapIsRejectedWithItsValue) {
  init_process_group();
  auto net = ddp_test::make_closed_form_mlp();
  auto message = error_of([&] {
    DistributedDataParallel model(net, DistributedDataParallelOptions().bucket_cap_mb(0));
  });
  EXPECT_NE(message.find("bucket_cap_mb"), std::string::npos) << message;
  message = error_of([&] {
    DistributedDataParallel model(net, DistributedDataParallelOptions().first_bucket_cap_mb(-1));
  });
  EXPECT_NE(message.find("first_bucket_cap_mb"), std::string::npos) << message;
}

// A world of size 1 (no launcher): one step through DDP is one plain step.
TEST_F(DistributedDataParallelTest, WorldOfOneTrainsLikeThePlainModule) {
  auto group = init_process_group();
  ASSERT_EQ(group->size(), 1);
  auto reference = ddp_test::make_closed_form_mlp();
  auto net = ddp_test::make_closed_form_mlp();
  DistributedDataParallel model(net);
  EXPECT_EQ(model->process_group(), group);
  EXPECT_EQ(model->module(), net.ptr());
  EXPECT_EQ(model->module_as<torch::nn::SequentialImpl>(), net.ptr());

  auto [x, y] = ddp_test::global_batch(0);
  torch::mse_loss(reference->forward(x), y).backward();
  torch::mse_loss(model(x), y).backward();
  auto reference_parameters = reference->named_parameters();
  for (const auto& p : net->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::allclose(p.value().grad(), reference_parameters[p.key()].grad(), 0, 1e-6))
        << p.key();
  }
  EXPECT_EQ(model->last_iteration_insight().iteration, 1);
  EXPECT_EQ(model->max_parameter_difference_across_ranks(), 0);
}

} // namespace
} // namespace ddp
