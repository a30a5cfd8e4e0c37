// DistributedDataParallel in one process, without a launcher: the error for
// a missing process group, option errors, a module with nothing to train,
// sparse gradients on a group that cannot reduce them, and a world of size
// 1. The
// multi-rank behaviour is tested by the programs run under ddprun
// (tests/nn/*_main.cpp).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include <ddp/comm/process_group_composite.h>
#include <ddp/comm/process_group_gloo.h>
#include <ddp/ddp.h>
#include <ddp/store/hash_store.h>

#include "nn/closed_form.h"

#include "testing/errors.h"
#include "testing/fake_process_group.h"

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

// As PyTorch: nothing to average, so DDP is refused, saying why.
TEST_F(DistributedDataParallelTest, ModuleWithNothingToTrainIsRefused) {
  init_process_group();
  torch::nn::Sequential no_parameters{torch::nn::ReLU()};
  auto message = error_of([&] { DistributedDataParallel model(no_parameters); });
  EXPECT_NE(message.find("[rank 0/1] DistributedDataParallel: the module has no parameter that "
                         "requires a gradient (it has no parameters)"),
            std::string::npos)
      << message;
  auto frozen = ddp_test::make_closed_form_mlp();
  for (auto& p : frozen->parameters()) {
    p.set_requires_grad(false);
  }
  message = error_of([&] { DistributedDataParallel model(frozen); });
  EXPECT_NE(message.find("all 8 of its parameters have requires_grad() false"), std::string::npos)
      << message;
  // One trainable parameter is enough.
  frozen->parameters().back().set_requires_grad(true);
  EXPECT_EQ(error_of([&] { DistributedDataParallel model(frozen); }), "<no error>");
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

// JoinOptions().enable(false): the Join does nothing, as PyTorch's
// enable=False (no Join is registered, so another may be made).
TEST_F(DistributedDataParallelTest, DisabledJoinDoesNothing) {
  init_process_group();
  auto net = ddp_test::make_closed_form_mlp();
  DistributedDataParallel model(net);
  Join disabled(model, JoinOptions().enable(false));
  auto [x, y] = ddp_test::global_batch(0);
  torch::mse_loss(model(x), y).backward();
  EXPECT_EQ(disabled.finish(), 0);
  Join enabled(model);
  torch::mse_loss(model(x), y).backward();
  EXPECT_EQ(enabled.finish(), 0); // alone: nobody to shadow
  const auto message = error_of([&] { Join second(model); Join third(model); });
  EXPECT_NE(message.find("already has a live Join"), std::string::npos) << message;
}

// ---- Sparse gradients: which groups can reduce them, asked at construction

// A backend that declares no sparse allreduce, as NCCL and MPI
// (testing/fake_process_group.h): a world of one whose operations complete
// at once.
using DenseOnlyGroup = testing::FakeProcessGroup;

// As NCCL would: refused when the wrapper is built, naming the parameter
// and the backend, not in backward.
TEST_F(DistributedDataParallelTest, SparseGradientsOnAGroupThatCannotReduceThemAreRefusedAtConstruction) {
  ddp_test::EmbeddingNet net;
  const auto message = error_of([&] {
    DistributedDataParallel model(
        net, DistributedDataParallelOptions().process_group(std::make_shared<DenseOnlyGroup>()));
  });
  EXPECT_NE(message.find("[rank 0/1] DistributedDataParallel: parameter 'emb.weight' gets sparse "
                         "gradients (the weight of an Embedding or EmbeddingBag with "
                         "sparse(true)), but this process group (backend fake) cannot allreduce "
                         "sparse tensors on cpu"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Backend::kGloo"), std::string::npos) << message;
  // Dense gradients are fine there.
  ddp_test::EmbeddingNet dense;
  dense->emb->options.sparse(false);
  EXPECT_EQ(error_of([&] {
              DistributedDataParallel model(
                  dense, DistributedDataParallelOptions().process_group(std::make_shared<DenseOnlyGroup>()));
            }),
            "<no error>");
}

// A composite group answers for the backend of the model's device: with
// Gloo serving the CPU, a CPU model is accepted; with a backend that
// declares nothing there (as NCCL for a CUDA model on cpu:gloo,cuda:nccl),
// refused. (A LibTorch module cannot be moved to the meta device in 1.13,
// so the fake serves the CPU here; sparse_allreduce_test checks the answer
// per device type.)
TEST_F(DistributedDataParallelTest, CompositeGroupAnswersForTheBackendOfTheModelsDevice) {
  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> with_gloo;
  with_gloo[c10::DeviceType::CPU] = ProcessGroupGloo::create(std::make_shared<HashStore>(), 0, 1);
  with_gloo[c10::DeviceType::Meta] = std::make_shared<DenseOnlyGroup>();
  ddp_test::EmbeddingNet net;
  EXPECT_EQ(error_of([&] {
              DistributedDataParallel model(
                  net, DistributedDataParallelOptions().process_group(
                           std::make_shared<CompositeProcessGroup>(std::move(with_gloo))));
            }),
            "<no error>");

  std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> without;
  without[c10::DeviceType::CPU] = std::make_shared<DenseOnlyGroup>();
  const auto message = error_of([&] {
    DistributedDataParallel model(
        net, DistributedDataParallelOptions().process_group(
                 std::make_shared<CompositeProcessGroup>(std::move(without))));
  });
  EXPECT_NE(message.find("parameter 'emb.weight' gets sparse gradients"), std::string::npos) << message;
  EXPECT_NE(message.find("(backend cpu:fake) cannot allreduce sparse tensors on cpu"),
            std::string::npos)
      << message;
}

// A world of size 1: the sparse gradient stays sparse, comes out coalesced,
// and equals plain training's.
TEST_F(DistributedDataParallelTest, WorldOfOneKeepsSparseGradientsSparse) {
  init_process_group();
  ddp_test::EmbeddingNet reference;
  ddp_test::init_closed_form(*reference);
  ddp_test::EmbeddingNet net;
  ddp_test::init_closed_form(*net);
  DistributedDataParallel model(net);
  const auto tokens = ddp_test::rank_tokens(0, 0, 1);
  const auto target = ddp_test::global_batch(0).second;
  torch::mse_loss(reference->forward(tokens), target).backward();
  torch::mse_loss(model(tokens), target).backward();
  const auto& grad = net->emb->weight.grad();
  ASSERT_TRUE(grad.defined() && grad.is_sparse());
  EXPECT_TRUE(grad.is_coalesced());
  EXPECT_TRUE(torch::allclose(grad.to_dense(), reference->emb->weight.grad().to_dense(), 0, 1e-7));
  const auto layout = model->bucket_layout();
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_TRUE(layout[0].sparse != layout[1].sparse);
}

} // namespace
} // namespace ddp
