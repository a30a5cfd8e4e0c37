// SyncBatchNorm and convert_sync_batchnorm in one process: the module's
// layout against torch::nn::BatchNorm's, the conversion of a module tree
// (names, tensors, requires_grad, training flag, checkpoints both ways), the
// collectives it issues (none in eval mode or in a group of one; one
// allgather per training forward and one allreduce per backward, seen
// through a recording fake group), and the edge cases of the group's batch
// on ranks run as threads over Gloo: every rank empty, one value in the whole
// group. Parity on real processes: sync_batch_norm_main.cpp and the PyTorch
// parity test.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "testing/errors.h"
#include "testing/fake_process_group.h"
#include "testing/multi_rank.h"

namespace ddp {
namespace {

using nn::SyncBatchNorm;
using nn::SyncBatchNormImpl;
using nn::SyncBatchNormOptions;

// A fake group (testing/fake_process_group.h) that records every operation;
// with `mirror`, one of `size` ranks that all hold this rank's tensors.
std::shared_ptr<testing::FakeProcessGroup> recording_group(int rank, int size, bool mirror = false) {
  auto group = std::make_shared<testing::FakeProcessGroup>(rank, size);
  group->mirror = mirror;
  return group;
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.detach().to(torch::kDouble) - b.detach().to(torch::kDouble)).abs().max().item<double>();
}

// Sets every parameter and buffer of `module` to values of its own (the
// counter stays an integer), so that a test sees them carried over.
void fill_distinct(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  double k = 1;
  for (auto& p : module.parameters()) {
    p.copy_(torch::linspace(0.5, 1.5, p.numel()).reshape(p.sizes()) * k);
    k += 0.25;
  }
  for (auto& b : module.buffers()) {
    if (b.scalar_type() == torch::kLong) {
      b.fill_(7);
    } else {
      b.copy_(torch::linspace(0.1, 2.0, b.numel()).reshape(b.sizes()) * k);
      k += 0.25;
    }
  }
}

torch::Tensor input_2d(int64_t batch, int64_t channels, double phase = 0) {
  return torch::sin(torch::arange(batch * channels * 9, torch::kFloat) * 0.7 + phase)
      .reshape({batch, channels, 3, 3});
}

// ---- The module ------------------------------------------------------------------------

TEST(SyncBatchNorm, ChecksItsOptionsAndInput) {
  DDP_EXPECT_ERROR(SyncBatchNorm(0), "SyncBatchNorm: num_features must be positive (got 0)");
  DDP_EXPECT_ERROR(SyncBatchNorm(SyncBatchNormOptions(3).eps(-1)),
                   "eps must not be negative (got -1)");
  SyncBatchNorm bn(3);
  DDP_EXPECT_ERROR(bn(torch::ones({3})), "expected an input of at least 2 dimensions");
  DDP_EXPECT_ERROR(bn(torch::ones({2, 4})), "expected 3 channels in dimension 1 of the input, got input of shape [2, 4]");
}

TEST(SyncBatchNorm, HasBatchNormsParametersAndBuffers) {
  for (bool affine : {true, false}) {
    for (bool track : {true, false}) {
      auto options = torch::nn::BatchNormOptions(5).affine(affine).track_running_stats(track);
      torch::nn::BatchNorm2d batch_norm(options);
      SyncBatchNorm sync(options);
      EXPECT_EQ(sync->named_parameters().keys(), batch_norm->named_parameters().keys());
      EXPECT_EQ(sync->named_buffers().keys(), batch_norm->named_buffers().keys());
      for (const auto& p : batch_norm->named_parameters()) {
        EXPECT_TRUE(torch::equal(sync->named_parameters()[p.key()], p.value())) << p.key();
        EXPECT_TRUE(sync->named_parameters()[p.key()].requires_grad()) << p.key();
      }
      for (const auto& b : batch_norm->named_buffers()) {
        EXPECT_TRUE(torch::equal(sync->named_buffers()[b.key()], b.value())) << b.key();
        EXPECT_EQ(sync->named_buffers()[b.key()].scalar_type(), b.value().scalar_type());
      }
    }
  }
  std::ostringstream text;
  text << *SyncBatchNorm(SyncBatchNormOptions(4).momentum(c10::nullopt));
  EXPECT_EQ(text.str(),
            "ddp::nn::SyncBatchNorm(4, eps=1e-05, momentum=None, affine=true, track_running_stats=true)");
}

TEST(SyncBatchNorm, CloneCopiesTheStateIntoNewTensors) {
  SyncBatchNorm bn(3);
  fill_distinct(*bn);
  auto copy = std::dynamic_pointer_cast<SyncBatchNormImpl>(bn->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(torch::equal(copy->weight, bn->weight));
  EXPECT_TRUE(torch::equal(copy->running_var, bn->running_var));
  EXPECT_FALSE(copy->weight.is_same(bn->weight));
}

// Eval mode normalises with the running statistics and never communicates,
// also with a group of several ranks; so does eval mode without running
// statistics (the batch's own, locally), as in PyTorch.
TEST(SyncBatchNorm, EvalModeIssuesNoCollective) {
  for (bool track : {true, false}) {
    auto fake = recording_group(0, 2);
    SyncBatchNorm sync(SyncBatchNormOptions(3).track_running_stats(track).process_group(fake));
    torch::nn::BatchNorm2d batch_norm(torch::nn::BatchNormOptions(3).track_running_stats(track));
    fill_distinct(*sync);
    fill_distinct(*batch_norm);
    sync->eval();
    batch_norm->eval();
    auto x = input_2d(4, 3).requires_grad_(true);
    auto x_ref = x.detach().clone().requires_grad_(true);
    auto y = sync(x);
    auto y_ref = batch_norm(x_ref);
    (y * y).sum().backward();
    (y_ref * y_ref).sum().backward();
    EXPECT_LT(max_difference(y, y_ref), 1e-6) << "track_running_stats " << track;
    EXPECT_LT(max_difference(x.grad(), x_ref.grad()), 1e-5);
    EXPECT_TRUE(fake->calls.empty()) << fake->calls.front();
  }
}

// A group of one rank: exactly BatchNorm, training included, and no
// communication.
TEST(SyncBatchNorm, GroupOfOneIsBatchNormWithoutCommunication) {
  for (c10::optional<double> momentum : {c10::optional<double>(0.3), c10::optional<double>()}) {
    auto fake = recording_group(0, 1);
    auto options = torch::nn::BatchNormOptions(3).momentum(momentum);
    SyncBatchNorm sync(SyncBatchNormOptions(options).process_group(fake));
    torch::nn::BatchNorm2d batch_norm(options);
    for (int step = 0; step < 3; ++step) {
      auto x = input_2d(4, 3, step).requires_grad_(true);
      auto x_ref = x.detach().clone().requires_grad_(true);
      auto y = sync(x);
      auto y_ref = batch_norm(x_ref);
      (y * y.detach().cos()).sum().backward();
      (y_ref * y_ref.detach().cos()).sum().backward();
      EXPECT_LT(max_difference(y, y_ref), 1e-6);
      EXPECT_LT(max_difference(x.grad(), x_ref.grad()), 1e-6);
    }
    EXPECT_LT(max_difference(sync->running_var, batch_norm->running_var), 1e-6);
    EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 3);
    EXPECT_LT(max_difference(sync->weight.grad(), batch_norm->weight.grad()), 1e-6);
    EXPECT_TRUE(fake->calls.empty()) << fake->calls.front();
  }
}

// Training over a group of two whose ranks hold the same batch (the mirror
// fake): one allgather per forward, one allreduce per backward, and the
// numbers of BatchNorm on the batch twice over: the same output and input
// gradient, the unbiased variance over 2n values, and half the parameters'
// gradients (each rank holds its own share; DDP would average them).
TEST(SyncBatchNorm, TrainingGathersOnceForwardAndReducesOnceBackward) {
  auto fake = recording_group(0, 2, /*mirror=*/true);
  SyncBatchNorm sync(SyncBatchNormOptions(3).process_group(fake));
  torch::nn::BatchNorm2d batch_norm(3);
  fill_distinct(*sync);
  fill_distinct(*batch_norm);
  auto x = input_2d(4, 3).requires_grad_(true);
  auto x_ref = x.detach().clone().requires_grad_(true);
  auto y = sync(x);
  EXPECT_EQ(fake->calls, std::vector<std::string>{"allgather_into_tensor"});
  auto y_ref = batch_norm(torch::cat({x_ref, x_ref}));
  auto weights = torch::cos(torch::arange(y.numel(), torch::kFloat)).reshape(y.sizes());
  (y * weights).sum().backward();
  (y_ref * torch::cat({weights, weights})).sum().backward();
  EXPECT_EQ(fake->calls, (std::vector<std::string>{"allgather_into_tensor", "allreduce"}));

  EXPECT_LT(max_difference(y, y_ref.narrow(0, 0, 4)), 1e-5);
  EXPECT_LT(max_difference(x.grad(), x_ref.grad() / 2), 1e-5);
  EXPECT_LT(max_difference(sync->running_mean, batch_norm->running_mean), 1e-6);
  EXPECT_LT(max_difference(sync->running_var, batch_norm->running_var), 1e-6);
  EXPECT_LT(max_difference(sync->weight.grad(), batch_norm->weight.grad() / 2), 1e-5);
  EXPECT_LT(max_difference(sync->bias.grad(), batch_norm->bias.grad() / 2), 1e-5);

  // An input that needs no gradient: no allreduce, the parameters' still.
  fake->calls.clear();
  sync->zero_grad();
  sync(x.detach()).sum().backward();
  EXPECT_EQ(fake->calls, std::vector<std::string>{"allgather_into_tensor"});
  EXPECT_TRUE(sync->bias.grad().defined());
}

TEST(SyncBatchNorm, RefusesDoubleBackward) {
  auto fake = recording_group(0, 2, /*mirror=*/true);
  SyncBatchNorm sync(SyncBatchNormOptions(3).process_group(fake));
  auto x = input_2d(4, 3).requires_grad_(true);
  auto y = sync(x);
  DDP_EXPECT_ERROR(torch::autograd::grad({y.square().sum()}, {x}, {}, /*retain_graph=*/true,
                                         /*create_graph=*/true),
                   "double backward (create_graph=true) is not supported");
}

// ---- Edge cases of the group's batch, on ranks run as threads over Gloo -----------------

// Rank r of 3 holds `sizes[r]` samples of the batch; every rank checks its
// output and input gradient against BatchNorm on the whole batch (its
// parameters' gradients are its share: summed over ranks, BatchNorm's).
void expect_matches_whole_batch(const std::vector<int64_t>& sizes) {
  const int world = static_cast<int>(sizes.size());
  int64_t total = 0;
  for (auto n : sizes) {
    total += n;
  }
  const auto whole = input_2d(total, 3);
  const auto weights = torch::cos(torch::arange(whole.numel(), torch::kFloat)).reshape(whole.sizes());
  torch::nn::BatchNorm2d batch_norm(3);
  fill_distinct(*batch_norm);
  auto whole_ref = whole.clone().requires_grad_(true);
  auto y_ref = batch_norm(whole_ref);
  (y_ref * weights).sum().backward();

  testing::run_threads(world, [&](int rank, std::shared_ptr<Store> store) {
    auto group = testing::make_gloo_group(store, rank, world);
    SyncBatchNorm sync(SyncBatchNormOptions(3).process_group(group));
    fill_distinct(*sync);
    int64_t first = 0;
    for (int r = 0; r < rank; ++r) {
      first += sizes[static_cast<size_t>(r)];
    }
    const int64_t n = sizes[static_cast<size_t>(rank)];
    auto x = whole.narrow(0, first, n).clone().requires_grad_(true);
    auto y = sync(x);
    (y * weights.narrow(0, first, n)).sum().backward();
    EXPECT_EQ(y.sizes(), x.sizes());
    if (n > 0) {
      EXPECT_LT(max_difference(y, y_ref.narrow(0, first, n)), 1e-5) << "rank " << rank;
      EXPECT_LT(max_difference(x.grad(), whole_ref.grad().narrow(0, first, n)), 1e-5);
    }
    EXPECT_LT(max_difference(sync->running_mean, batch_norm->running_mean), 1e-6);
    EXPECT_LT(max_difference(sync->running_var, batch_norm->running_var), 1e-6);
    auto grads = torch::cat({sync->weight.grad(), sync->bias.grad()});
    group->allreduce(grads)->wait();
    EXPECT_LT(max_difference(grads, torch::cat({batch_norm->weight.grad(), batch_norm->bias.grad()})),
              1e-5);
  });
}

TEST(SyncBatchNorm, UnevenAndEmptyRanksMatchTheWholeBatch) {
  expect_matches_whole_batch({3, 5, 1});
  expect_matches_whole_batch({0, 4, 0});
}

TEST(SyncBatchNorm, EveryRankEmptyGivesAnEmptyOutputAndKeepsTheStatistics) {
  testing::run_threads(2, [](int rank, std::shared_ptr<Store> store) {
    auto group = testing::make_gloo_group(store, rank, 2);
    SyncBatchNorm sync(SyncBatchNormOptions(3).process_group(group));
    auto x = torch::zeros({0, 3, 2}).requires_grad_(true);
    auto y = sync(x);
    y.sum().backward();
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_TRUE(torch::equal(sync->running_mean, torch::zeros({3})));
    EXPECT_TRUE(torch::equal(sync->running_var, torch::ones({3})));
    EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 1);
  });
}

TEST(SyncBatchNorm, OneValueInTheWholeGroupIsAnErrorOnEveryRank) {
  testing::run_threads(2, [](int rank, std::shared_ptr<Store> store) {
    auto group = testing::make_gloo_group(store, rank, 2);
    SyncBatchNorm sync(SyncBatchNormOptions(3).process_group(group));
    auto x = torch::ones({rank == 0 ? 1 : 0, 3});
    DDP_EXPECT_ERROR(sync(x), "SyncBatchNorm: expected more than 1 value per channel when training, got 1 in the whole group");
  });
}

// ---- convert_sync_batchnorm ----------------------------------------------------------

// A custom module that holds BatchNorms only inside containers.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : body(register_module("body", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 1)),
                                                           torch::nn::BatchNorm2d(4),
                                                           torch::nn::ReLU()))),
        norms(register_module("norms", torch::nn::ModuleList(torch::nn::BatchNorm1d(4)))),
        by_name(register_module("by_name", torch::nn::ModuleDict())) {
    by_name->update({{"volume", std::make_shared<torch::nn::BatchNorm3dImpl>(2)}});
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return body->forward(x);
  }
  torch::nn::Sequential body;
  torch::nn::ModuleList norms;
  torch::nn::ModuleDict by_name;
};
TORCH_MODULE(Block);

// A custom module with a BatchNorm as its own member.
struct MemberImpl : torch::nn::Module {
  MemberImpl() : bn(register_module("bn", torch::nn::BatchNorm2d(4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return bn(x);
  }
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(Member);

// The same layer held in a container, which the conversion replaces.
struct InListImpl : torch::nn::Module {
  InListImpl() : norms(register_module("norms", torch::nn::ModuleList(torch::nn::BatchNorm2d(4)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    if (auto sync = norms->ptr<SyncBatchNormImpl>(0)) {
      return sync->forward(x);
    }
    return norms->ptr<torch::nn::BatchNorm2dImpl>(0)->forward(x);
  }
  torch::nn::ModuleList norms;
};
TORCH_MODULE(InList);

torch::nn::Sequential make_tree() {
  torch::nn::Sequential net(Block(), torch::nn::BatchNorm2d(4));
  fill_distinct(*net);
  return net;
}

std::vector<std::string> sync_batch_norm_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_modules()) {
    if (std::dynamic_pointer_cast<SyncBatchNormImpl>(item.value())) {
      names.push_back(item.key());
    }
  }
  return names;
}

TEST(ConvertSyncBatchnorm, KeepsNamesTensorsRequiresGradAndTrainingFlag) {
  auto net = make_tree();
  auto block = net->ptr<BlockImpl>(0);
  block->body[1]->as<torch::nn::BatchNorm2dImpl>()->bias.set_requires_grad(false);
  block->norms[0]->eval();
  const auto parameters = net->named_parameters();
  const auto buffers = net->named_buffers();

  auto fake = recording_group(0, 2, /*mirror=*/true);
  auto converted = nn::convert_sync_batchnorm(net, fake);
  EXPECT_EQ(converted.ptr(), net.ptr());
  EXPECT_EQ(sync_batch_norm_names(*net),
            (std::vector<std::string>{"0.body.1", "0.norms.0", "0.by_name.volume", "1"}));

  // The same tensors under the same names, requires_grad included.
  EXPECT_EQ(net->named_parameters().keys(), parameters.keys());
  EXPECT_EQ(net->named_buffers().keys(), buffers.keys());
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(p.value().is_same(parameters[p.key()])) << p.key();
    EXPECT_EQ(p.value().requires_grad(), p.key() != "0.body.1.bias") << p.key();
  }
  for (const auto& b : net->named_buffers()) {
    EXPECT_TRUE(b.value().is_same(buffers[b.key()])) << b.key();
  }
  EXPECT_FALSE(block->norms[0]->is_training());
  EXPECT_TRUE(block->body[1]->is_training());

  // The containers' own storage, which their forward and indexing read.
  EXPECT_TRUE(block->body->ptr<SyncBatchNormImpl>(1));
  EXPECT_TRUE(block->norms->ptr<SyncBatchNormImpl>(0));
  EXPECT_TRUE(std::dynamic_pointer_cast<SyncBatchNormImpl>(block->by_name["volume"]));
  EXPECT_EQ(block->body->ptr<SyncBatchNormImpl>(1)->options.process_group(), fake);
  net->forward(input_2d(2, 3));
  EXPECT_EQ(fake->calls, (std::vector<std::string>{"allgather_into_tensor", "allgather_into_tensor"}));
}

TEST(ConvertSyncBatchnorm, CheckpointsLoadBothWays) {
  auto plain = make_tree();
  std::stringstream saved_plain;
  torch::save(plain, saved_plain);

  auto converted = nn::convert_sync_batchnorm(make_tree());
  {
    torch::NoGradGuard no_grad;
    for (auto& t : converted->parameters()) {
      t.zero_();
    }
    for (auto& t : converted->buffers()) {
      t.zero_();
    }
  }
  torch::load(converted, saved_plain);
  for (const auto& p : plain->named_parameters()) {
    EXPECT_TRUE(torch::equal(converted->named_parameters()[p.key()], p.value())) << p.key();
  }
  for (const auto& b : plain->named_buffers()) {
    EXPECT_TRUE(torch::equal(converted->named_buffers()[b.key()], b.value())) << b.key();
  }

  std::stringstream saved_converted;
  torch::save(converted, saved_converted);
  auto fresh = torch::nn::Sequential(Block(), torch::nn::BatchNorm2d(4));
  torch::load(fresh, saved_converted);
  for (const auto& b : plain->named_buffers()) {
    EXPECT_TRUE(torch::equal(fresh->named_buffers()[b.key()], b.value())) << b.key();
  }
}

TEST(ConvertSyncBatchnorm, ReplacesABatchNormRootAndSharedLayersOnce) {
  torch::nn::BatchNorm2d root(4);
  root->eval();
  auto sync = nn::convert_sync_batchnorm(root);
  EXPECT_TRUE(sync->weight.is_same(root->weight));
  EXPECT_TRUE(sync->num_batches_tracked.is_same(root->num_batches_tracked));
  EXPECT_FALSE(sync->is_training());
  auto as_module = nn::convert_sync_batchnorm(std::static_pointer_cast<torch::nn::Module>(root.ptr()));
  EXPECT_TRUE(std::dynamic_pointer_cast<SyncBatchNormImpl>(as_module));

  torch::nn::BatchNorm1d shared(4);
  torch::nn::ModuleList twice(shared, torch::nn::Sequential(shared));
  nn::convert_sync_batchnorm(twice);
  EXPECT_EQ(twice->ptr(0), twice->ptr<torch::nn::SequentialImpl>(1)->ptr(0));
  EXPECT_TRUE(twice->ptr<SyncBatchNormImpl>(0));
}

// A BatchNorm held as a custom module's member stays a BatchNorm, and its
// training forwards become SyncBatchNorm's (Note [BatchNorms synchronised
// in place]): the same collectives, output, gradients and running
// statistics, bit for bit, as the SyncBatchNorm that replaces the same
// layer held in a container, over the same (mirrored) group.
TEST(ConvertSyncBatchnorm, SynchronisesABatchNormMemberWhereItStands) {
  torch::nn::Sequential net(torch::nn::BatchNorm2d(4), Member());
  torch::nn::Sequential replaced(torch::nn::BatchNorm2d(4), InList());
  fill_distinct(*net);
  fill_distinct(*replaced);
  auto fake = recording_group(0, 2, /*mirror=*/true);
  auto fake_replaced = recording_group(0, 2, /*mirror=*/true);
  nn::convert_sync_batchnorm(net, fake);
  nn::convert_sync_batchnorm(replaced, fake_replaced);
  EXPECT_EQ(sync_batch_norm_names(*net), (std::vector<std::string>{"0"}));
  EXPECT_EQ(sync_batch_norm_names(*replaced), (std::vector<std::string>{"0", "1.norms.0"}));
  auto member = net->ptr<MemberImpl>(1);
  EXPECT_TRUE(member->bn.ptr() == member->named_children()["bn"]);
  EXPECT_EQ(member->bn->name(), "torch::nn::BatchNorm2dImpl");

  const auto x = input_2d(3, 4).requires_grad_(true);
  const auto out = net->forward(x);
  EXPECT_EQ(fake->calls, (std::vector<std::string>{"allgather_into_tensor", "allgather_into_tensor"}));
  const auto x_replaced = input_2d(3, 4).requires_grad_(true);
  const auto out_replaced = replaced->forward(x_replaced);
  EXPECT_TRUE(torch::equal(out, out_replaced));
  const auto buffers = replaced->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_TRUE(torch::equal(net->buffers()[i], buffers[i])) << net->named_buffers().keys()[i];
  }
  out.square().sum().backward();
  out_replaced.square().sum().backward();
  EXPECT_EQ(fake->calls, fake_replaced->calls);
  EXPECT_EQ(fake->calls.back(), "allreduce");
  EXPECT_TRUE(torch::equal(x.grad(), x_replaced.grad()));
  const auto parameters = replaced->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    EXPECT_TRUE(torch::equal(net->parameters()[i].grad(), parameters[i].grad())) << net->named_parameters().keys()[i];
  }

  // Eval mode, and another BatchNorm that was not converted: no collective.
  fake->calls.clear();
  net->eval();
  net->forward(input_2d(2, 4));
  torch::nn::BatchNorm2d other(4);
  other(input_2d(2, 4));
  EXPECT_TRUE(fake->calls.empty());
}

// Converted twice: the second group is used, the first name kept; a
// layer that is gone is forgotten, and one that holds another weight now
// is not taken for the one converted.
TEST(ConvertSyncBatchnorm, AMemberConvertedAgainOrGoneIsTrackedByItsTensors) {
  Member holder;
  auto first = recording_group(0, 2, /*mirror=*/true);
  auto second = recording_group(0, 2, /*mirror=*/true);
  nn::convert_sync_batchnorm(holder, first);
  nn::convert_sync_batchnorm(holder, second);
  holder(input_2d(2, 4));
  EXPECT_TRUE(first->calls.empty());
  EXPECT_EQ(second->calls, (std::vector<std::string>{"allgather_into_tensor"}));

  const auto old_weight = holder->bn->weight;
  holder->bn->weight = torch::ones({4}).requires_grad_(true); // what its forward passes from now on
  second->calls.clear();
  holder(input_2d(2, 4));
  EXPECT_TRUE(second->calls.empty());

  auto gone = recording_group(0, 2, /*mirror=*/true);
  {
    Member temporary;
    nn::convert_sync_batchnorm(temporary, gone);
    temporary(input_2d(2, 4));
  }
  EXPECT_EQ(gone->calls.size(), 1u);
  for (int i = 0; i < 4; ++i) {
    torch::nn::BatchNorm2d fresh(4); // may reuse the freed tensors' addresses
    fresh(input_2d(2, 4));
  }
  EXPECT_EQ(gone->calls.size(), 1u);
}

// A member with nothing of its own to be known by (no weight, no running
// statistics) is refused, naming it, before anything changes.
TEST(ConvertSyncBatchnorm, RefusesAMemberWithNeitherWeightNorRunningStatistics) {
  struct BareImpl : torch::nn::Module {
    BareImpl()
        : bn(register_module(
              "bn", torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4).affine(false).track_running_stats(false)))) {}
    torch::Tensor forward(const torch::Tensor& x) {
      return bn(x);
    }
    torch::nn::BatchNorm2d bn;
  };
  torch::nn::Sequential net(torch::nn::BatchNorm2d(4), std::make_shared<BareImpl>());
  DDP_EXPECT_ERROR(nn::convert_sync_batchnorm(net),
                   "convert_sync_batchnorm: '1.bn' is a torch::nn::BatchNorm2d registered directly in "
                   "the custom module");
  EXPECT_TRUE(std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(net->ptr(0)));
  EXPECT_TRUE(sync_batch_norm_names(*net).empty());
}

} // namespace
} // namespace ddp
