// torch.distributed.checkpoint directories in one process (no group): the
// boxes that FSDP's shards become, save and load round trips, and every
// bad input refused before anything changes, naming the file and the key.
// Several ranks, resharding and commits are dcp_cases.sh's; PyTorch's side
// is interop_cases.sh's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <random>

#include <ddp/checkpoint/dcp.h>
#include <ddp/checkpoint/state_dict.h>

#include "checkpoint/dcp/boxes.h"
#include "checkpoint/checkpoint_testing.h"
#include "checkpoint/interop_model.h"

namespace {

namespace cd = ddp::checkpoint::dcp;

using ddp_test::checkpoint::error_of;
using ddp_test::checkpoint::read_all;
using ddp_test::checkpoint::TempDir;
using ddp_test::checkpoint::write_all;

// ---- boxes -------------------------------------------------------------------------

TEST(Boxes, WorkedExample) {
  // boxes.h: a 4 x 3 weight, elements [2, 10).
  const auto boxes = cd::boxes_of_range({4, 3}, 2, 10);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].box.offsets, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(boxes[0].box.sizes, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(boxes[1].box.offsets, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(boxes[1].box.sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(boxes[2].box.offsets, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(boxes[2].box.sizes, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(boxes[2].flat_begin, 9);
}

TEST(Boxes, EveryRangeIsCoveredOnceInOrder) {
  std::mt19937 random(3);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int64_t> shape(1 + random() % 4);
    int64_t numel = 1;
    for (auto& d : shape) {
      d = 1 + random() % 5;
      numel *= d;
    }
    const int64_t begin = random() % (numel + 1);
    const int64_t end = begin + random() % (numel - begin + 1);
    auto seen = torch::zeros({numel}, torch::kLong);
    auto index = torch::arange(numel).view(shape);
    int64_t next = begin;
    for (const auto& fb : cd::boxes_of_range(shape, begin, end)) {
      // Each box is contiguous in row-major order and starts where the
      // previous one ended.
      ASSERT_EQ(fb.flat_begin, next);
      const cd::Box all{std::vector<int64_t>(shape.size(), 0), shape};
      const auto part = cd::narrow_to(index, all, fb.box).reshape({-1});
      ASSERT_TRUE(at::equal(part, torch::arange(fb.flat_begin, fb.flat_begin + fb.box.numel())));
      seen.index_add_(0, part, torch::ones_like(part));
      next += fb.box.numel();
    }
    ASSERT_EQ(next, end);
    auto expected = torch::zeros({numel}, torch::kLong);
    expected.slice(0, begin, end).fill_(1);
    ASSERT_TRUE(at::equal(seen, expected));
  }
}

// ---- save and load in one process ---------------------------------------------------

struct Trained {
  torch::nn::Sequential net = ddp_test::interop::make_model();
  std::unique_ptr<torch::optim::Optimizer> opt;
  explicit Trained(const std::string& optimizer, int steps = 2) {
    opt = ddp_test::interop::make_optimizer(optimizer, net->parameters());
    train(0, steps);
  }
  void train(int from, int n) {
    for (int s = from; s < from + n; ++s) {
      auto [x, y] = ddp_test::interop::batch(s, 0, 1);
      opt->zero_grad();
      torch::mse_loss(net->forward(x), y).backward();
      opt->step();
    }
  }
};

void expect_same(const ddp::StateDict& a, const ddp::StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& item : a) {
    EXPECT_TRUE(at::equal(item.value(), b[item.key()])) << item.key();
  }
}

TEST(Dcp, RoundTripThenTheSameSteps) {
  for (const char* optimizer : {"adam", "sgd", "rmsprop"}) {
    SCOPED_TRACE(optimizer);
    TempDir dir;
    Trained a(optimizer);
    ddp::dcp::save(*a.net, a.opt.get(), dir.path());
    Trained b(optimizer, 0);
    const auto result = ddp::dcp::load(*b.net, b.opt.get(), dir.path());
    EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
    expect_same(ddp::module_state_dict(*a.net), ddp::module_state_dict(*b.net));
    expect_same(ddp::module_state_dict(*a.net), ddp::dcp::read_model_state(dir.path()));
    a.train(2, 2);
    b.train(2, 2);
    expect_same(ddp::module_state_dict(*a.net), ddp::module_state_dict(*b.net));
  }
}

TEST(Dcp, ASecondSaveReplacesTheFirstAndCleansUp) {
  TempDir dir;
  Trained a("adam");
  ddp::dcp::save(*a.net, a.opt.get(), dir.path());
  EXPECT_FALSE(read_all(dir.file("__0_0.distcp")).empty());
  a.train(2, 1);
  ddp::dcp::save(*a.net, a.opt.get(), dir.path());
  EXPECT_TRUE(read_all(dir.file("__0_0.distcp")).empty()) << "the first save's file is still there";
  EXPECT_FALSE(read_all(dir.file("__0_1.distcp")).empty());
  Trained b("adam", 0);
  ddp::dcp::load(*b.net, b.opt.get(), dir.path());
  expect_same(ddp::module_state_dict(*a.net), ddp::module_state_dict(*b.net));
}

// ---- bad input ------------------------------------------------------------------------

class DcpBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::make_unique<Trained>("adam");
    ddp::dcp::save(*a_->net, a_->opt.get(), dir_.path());
    good_metadata_ = read_all(dir_.file(".metadata"));
    good_data_ = read_all(dir_.file("__0_0.distcp"));
  }
  // Loads into a fresh model and optimizer, which must be unchanged after a
  // refusal.
  std::string load(torch::nn::Module* module = nullptr, bool strict = true) {
    Trained b("adam", 0);
    const auto before = ddp::module_state_dict(*b.net)["0.weight"].clone();
    const std::string message = error_of([&] {
      ddp::dcp::load(module != nullptr ? *module : static_cast<torch::nn::Module&>(*b.net),
                     module != nullptr ? nullptr : b.opt.get(), dir_.path(), nullptr,
                     ddp::dcp::LoadOptions().strict(strict));
    });
    if (!message.empty() && module == nullptr) {
      EXPECT_TRUE(at::equal(before, ddp::module_state_dict(*b.net)["0.weight"])) << "changed before: " << message;
      EXPECT_TRUE(b.opt->state().empty()) << "optimizer changed before: " << message;
    }
    return message;
  }
  void patch_metadata(const std::string& from, const std::string& to) {
    ASSERT_EQ(from.size(), to.size());
    std::string md = good_metadata_;
    const size_t at = md.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    md.replace(at, from.size(), to);
    write_all(dir_.file(".metadata"), md);
  }
  TempDir dir_;
  std::unique_ptr<Trained> a_;
  std::string good_metadata_;
  std::string good_data_;
};

TEST_F(DcpBadInput, NoCheckpoint) {
  std::remove(dir_.file(".metadata").c_str());
  EXPECT_NE(load().find("cannot open '" + dir_.file(".metadata") + "'"), std::string::npos);
}

TEST_F(DcpBadInput, TruncatedOrDamagedMetadata) {
  write_all(dir_.file(".metadata"), good_metadata_.substr(0, good_metadata_.size() / 2));
  EXPECT_NE(load().find("'" + dir_.file(".metadata") + "': not a pickle ddp can read"), std::string::npos);
  write_all(dir_.file(".metadata"), "garbage");
  EXPECT_NE(load().find("not a pickle ddp can read"), std::string::npos);
}

TEST_F(DcpBadInput, UnsupportedVersion) {
  patch_metadata("1.0.0", "9.9.9");
  EXPECT_NE(load().find("DCP format version '9.9.9', which ddp does not read: ddp reads version 1.0.0"),
            std::string::npos);
}

TEST_F(DcpBadInput, AFileThatLeavesTheDirectory) {
  patch_metadata("__0_0.distcp", "a/0_0.distcp");
  EXPECT_NE(load().find("file name 'a/0_0.distcp' is not a file of the checkpoint's directory"), std::string::npos);
}

TEST_F(DcpBadInput, MissingOrTruncatedChunkFile) {
  std::remove(dir_.file("__0_0.distcp").c_str());
  EXPECT_NE(load().find("'" + dir_.file("__0_0.distcp") + "', a file the checkpoint's metadata names, is missing"),
            std::string::npos);
  write_all(dir_.file("__0_0.distcp"), good_data_.substr(0, good_data_.size() - 100));
  EXPECT_NE(load().find("(truncated?)"), std::string::npos);
}

TEST_F(DcpBadInput, DamagedChunkFailsTheLoad) {
  // The damage is inside a chunk: found when it is read, after the checks.
  std::string bad = good_data_;
  for (size_t i = bad.size() / 2; i < bad.size() / 2 + 64; ++i) {
    bad[i] = static_cast<char>(~bad[i]);
  }
  write_all(dir_.file("__0_0.distcp"), bad);
  Trained b("adam", 0);
  const std::string message = error_of([&] { ddp::dcp::load(*b.net, b.opt.get(), dir_.path()); });
  EXPECT_NE(message.find(dir_.file("__0_0.distcp")), std::string::npos) << message;
}

TEST_F(DcpBadInput, KeysShapesAndDtypes) {
  // A model with a layer more: missing from the checkpoint.
  torch::nn::Sequential more(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                             torch::nn::Linear(16, 4), torch::nn::Linear(4, 4));
  EXPECT_NE(load(more.ptr().get()).find("missing from the checkpoint: model.4.weight, model.4.bias"),
            std::string::npos);
  const auto result = ddp::dcp::load(*more, nullptr, dir_.path(), nullptr, ddp::dcp::LoadOptions().strict(false));
  EXPECT_EQ(result.missing_keys, (std::vector<std::string>{"model.4.weight", "model.4.bias"}));
  // A model with a layer fewer: unexpected.
  torch::nn::Sequential fewer(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16));
  EXPECT_NE(load(fewer.ptr().get()).find("in the checkpoint and not in this model: model.3.weight, model.3.bias"),
            std::string::npos);
  // Another shape, another dtype.
  torch::nn::Sequential wider(torch::nn::Linear(8, 17), torch::nn::BatchNorm1d(17), torch::nn::ReLU(),
                              torch::nn::Linear(17, 4));
  EXPECT_NE(load(wider.ptr().get()).find("'model.0.weight' is Float[16, 8] in the checkpoint, Float[17, 8] here"),
            std::string::npos);
  auto doubled = ddp_test::interop::make_model();
  doubled->to(torch::kFloat64);
  EXPECT_NE(load(doubled.ptr().get()).find("'model.0.weight' is Float[16, 8] in the checkpoint, Double[16, 8] here"),
            std::string::npos);
}

TEST_F(DcpBadInput, OptimizerThatDoesNotFit) {
  Trained b("sgd", 0);
  EXPECT_ERROR(ddp::dcp::load(*b.net, b.opt.get(), dir_.path()),
               "dcp::load: parameter 0.weight: the state has 'step', which this optimizer does not keep");
  // Saved without an optimizer, loaded with one.
  TempDir plain;
  ddp::dcp::save(*a_->net, nullptr, plain.path());
  Trained c("adam", 0);
  EXPECT_ERROR(ddp::dcp::load(*c.net, c.opt.get(), plain.path()),
               "dcp::load: the optimizer: the checkpoint's optimizer has 0 parameter groups, this one 1");
}

} // namespace
