// The newer collectives on an NCCL group of one rank: the object
// collectives (their buffers on the current CUDA device), the uneven and
// list-form all-to-all, batched point-to-point's refusals, and the clear
// error for what the NCCL backend does not do (DDP with sparse gradients).
// World size 1: what more ranks add is the transfers, which the CPU
// backends' tests (tests/comm) check with 2 to 4 ranks.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include <ddp/comm/object_collectives.h>
#include <ddp/ddp.h>

#include "gpu/gpu_testing.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;
using ddp_gpu_test::message_of;

class NcclFeatures : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
    group_ = ddp_gpu_test::make_nccl_group_of_one();
  }

  std::shared_ptr<ProcessGroup> group_;
};

c10::IValue sample_object() {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert(std::string("name"), std::string("run-7"));
  dict.insert(std::string("lr"), 0.125);
  dict.insert(std::string("steps"), int64_t{12});
  dict.insert(std::string("weights"), torch::arange(6, torch::kFloat).reshape({2, 3}));
  return dict;
}

void expect_sample(const c10::IValue& value) {
  ASSERT_TRUE(value.isGenericDict()) << value.tagKind();
  const auto dict = value.toGenericDict();
  EXPECT_EQ(dict.at("name").toStringRef(), "run-7");
  EXPECT_EQ(dict.at("lr").toDouble(), 0.125);
  EXPECT_EQ(dict.at("steps").toInt(), 12);
  EXPECT_TRUE(torch::equal(dict.at("weights").toTensor(), torch::arange(6, torch::kFloat).reshape({2, 3})));
}

// Object collectives name ranks by the default group's numbering, so they
// run here on a default NCCL group of one (init_process_group over TCP).
TEST_F(NcclFeatures, ObjectCollectivesGoThroughTheDevice) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(testing::free_port()).c_str(), 1);
  auto group = init_process_group(InitOptions().backend(Backend::kNccl));
  ASSERT_EQ(group->backend_name(), "nccl");
  std::vector<c10::IValue> gathered;
  all_gather_object(gathered, sample_object());
  ASSERT_EQ(gathered.size(), 1u);
  expect_sample(gathered[0]);

  std::vector<c10::IValue> list = {sample_object(), c10::IValue(std::string("second"))};
  broadcast_object_list(list, 0);
  ASSERT_EQ(list.size(), 2u);
  expect_sample(list[0]);
  EXPECT_EQ(list[1].toStringRef(), "second");

  std::vector<c10::IValue> at_root;
  gather_object(sample_object(), &at_root, 0);
  ASSERT_EQ(at_root.size(), 1u);
  expect_sample(at_root[0]);

  std::vector<c10::IValue> mine(1);
  scatter_object_list(mine, {sample_object()}, 0);
  expect_sample(mine[0]);

  std::vector<std::string> bytes;
  all_gather_bytes(bytes, std::string("\0raw\xff", 5));
  ASSERT_EQ(bytes.size(), 1u);
  EXPECT_EQ(bytes[0], std::string("\0raw\xff", 5));
  // The group still works after them: nothing was left on its stream.
  auto t = torch::ones({4}, cuda());
  group->allreduce(t)->wait(std::chrono::seconds(60));
  EXPECT_TRUE(torch::equal(t.cpu(), torch::ones({4})));
  destroy_process_group();
}

TEST_F(NcclFeatures, UnevenAndListAllToAll) {
  auto input = torch::arange(5, torch::TensorOptions().dtype(torch::kFloat).device(cuda()));
  auto output = torch::empty({5}, input.options());
  AlltoallOptions splits;
  splits.input_split_sizes = {5};
  splits.output_split_sizes = {5};
  group_->alltoall(output, input, splits)->wait(std::chrono::seconds(60));
  EXPECT_TRUE(torch::equal(output.cpu(), torch::arange(5, torch::kFloat)));

  std::vector<at::Tensor> inputs = {torch::full({2, 3}, 7.0, cuda())};
  std::vector<at::Tensor> outputs = {torch::zeros({2, 3}, cuda())};
  group_->alltoall(outputs, inputs)->wait(std::chrono::seconds(60));
  EXPECT_TRUE(torch::equal(outputs[0].cpu(), torch::full({2, 3}, 7.0)));

  // A split that does not add up is refused before anything moves.
  AlltoallOptions wrong;
  wrong.input_split_sizes = {4};
  wrong.output_split_sizes = {5};
  const auto message = message_of<c10::Error>([&] { group_->alltoall(output, input, wrong)->wait(std::chrono::seconds(60)); });
  EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("alltoall"), std::string::npos) << message;
}

TEST_F(NcclFeatures, BatchPointToPointToItselfIsRefusedNamingTheRank) {
  auto tensor = torch::ones({3}, cuda());
  const auto message = message_of<c10::Error>([&] {
    group_->batch_point_to_point({PointToPointOp{/*is_send=*/true, tensor, /*peer=*/0, /*tag=*/0}});
  });
  EXPECT_NE(message.find("[rank 0/1] batch_isend_irecv: ops[0]: destination rank 0 is invalid"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("expected another rank"), std::string::npos) << message;
  // Nothing was posted: the group still works.
  group_->allreduce(tensor)->wait(std::chrono::seconds(60));
  EXPECT_TRUE(torch::equal(tensor.cpu(), torch::ones({3})));
}

TEST_F(NcclFeatures, SparseGradientsAreRefusedNamingTheBackend) {
  auto net = torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  net->to(cuda());
  const auto message = message_of<c10::Error>([&] {
    DistributedDataParallel model(net, DistributedDataParallelOptions().process_group(group_));
  });
  EXPECT_NE(message.find("sparse gradients"), std::string::npos) << message;
  EXPECT_NE(message.find("backend nccl"), std::string::npos) << message;
}

} // namespace
} // namespace ddp
