// DistributedDataParallel with sparse gradients (Embedding and EmbeddingBag
// with sparse(true); Note [Sparse gradients] in src/reducer/reducer.cpp)
// against one process: W ranks that each train on their slice of a global
// batch must end with the parameters one process gets on the whole batch.
// Also no_sync, gradient_as_bucket_view, fp16 compression, a sparse weight
// that a dense operation reads too, one used on some ranks only
// (find_unused_parameters), the bucket layout, and Join with uneven inputs.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_sparse_main
// prints one line per case on each rank, e.g.
//   [rank 0]: [ok] parity Embedding(sparse) + Linear: max |ours - reference|
//             (at emb.weight) 2.98e-08 (tolerance 1e-05)
// (on one line) and a summary; exits 1 if a case failed. Run alone (no
// launcher) it is a world of size 1.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::EmbeddingBagNet;
using ddp_test::EmbeddingNet;
using ddp_test::Report;

constexpr int kSteps = 5;
constexpr double kLearningRate = 0.2;
constexpr double kTolerance = 1e-5;

int rank() {
  return ddp::default_process_group()->rank();
}

int world_size() {
  return ddp::default_process_group()->size();
}

// Trains `reference` on whole global batches and `model` on this rank's
// slices, kSteps steps of SGD each; `check` runs after each DDP backward.
template <typename Net>
void train_both(Net reference, ddp::DistributedDataParallel& model,
                const std::function<void(int step)>& check = nullptr) {
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(kLearningRate));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int step = 0; step < kSteps; ++step) {
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(ddp_test::rank_tokens(step, 0, 1)),
                    ddp_test::global_batch(step).second)
        .backward();
    reference_optimizer.step();

    optimizer.zero_grad();
    torch::mse_loss(model(ddp_test::rank_tokens(step, rank(), world_size())),
                    ddp_test::rank_batch(step, rank(), world_size()).second)
        .backward();
    if (check) {
      check(step);
    }
    optimizer.step();
  }
}

void expect_parity(Report& report, const torch::nn::Module& net, const torch::nn::Module& reference,
                   const torch::nn::Module& initial, double tolerance) {
  const auto difference = ddp_test::max_parameter_difference(net, reference);
  report.expect_at_most(difference.value, tolerance,
                        "max |ours - reference| (at " + difference.where + ")");
  const auto moved = ddp_test::max_parameter_difference(reference, initial);
  report.expect(moved.value > 10 * tolerance,
                "training barely moved the weights (" + std::to_string(moved.value) +
                    "): the parity check is too weak");
}

template <typename Net>
Net closed_form(Net net) {
  ddp_test::init_closed_form(*net);
  return net;
}

// The gradient of `weight` after a DDP backward: sparse, coalesced, and the
// same on every rank.
void expect_reduced_sparse(Report& report, const torch::Tensor& weight, int step) {
  const auto& grad = weight.grad();
  const std::string at_step = " at step " + std::to_string(step);
  report.expect(grad.defined() && grad.is_sparse(), "the gradient is not sparse" + at_step);
  if (!grad.defined() || !grad.is_sparse()) {
    return;
  }
  report.expect(grad.is_coalesced(), "the reduced gradient is not coalesced" + at_step);
  const double spread =
      ddp_test::max_difference_from_rank0(*ddp::default_process_group(), {grad.to_dense()});
  report.expect(spread == 0, "the reduced gradient differs across ranks by " +
                                 std::to_string(spread) + at_step);
}

// ---- Parity with one process

void parity_embedding(Report& report, const std::string& label,
                      const ddp::DistributedDataParallelOptions& options) {
  report.begin_case("parity Embedding(sparse) + Linear" + label);
  auto reference = closed_form(EmbeddingNet());
  auto net = closed_form(EmbeddingNet());
  ddp::DistributedDataParallel model(net, options);
  train_both(reference, model,
             [&](int step) { expect_reduced_sparse(report, net->emb->weight, step); });
  expect_parity(report, *net, *reference, *closed_form(EmbeddingNet()), kTolerance);
  report.end_case();
}

void parity_embedding_bag(Report& report) {
  report.begin_case("parity EmbeddingBag(sparse, sum) + Linear");
  auto reference = closed_form(EmbeddingBagNet());
  auto net = closed_form(EmbeddingBagNet());
  ddp::DistributedDataParallel model(net);
  train_both(reference, model,
             [&](int step) { expect_reduced_sparse(report, net->bag->weight, step); });
  expect_parity(report, *net, *reference, *closed_form(EmbeddingBagNet()), kTolerance);
  report.end_case();
}

// The embedding's first rows also feed a dense product: its gradient comes
// out dense, is sent sparse, and is written back dense.
void parity_tied(Report& report) {
  report.begin_case("parity Embedding(sparse) also read densely (tied output rows)");
  auto reference = closed_form(EmbeddingNet(true));
  auto net = closed_form(EmbeddingNet(true));
  ddp::DistributedDataParallel model(net);
  train_both(reference, model, [&](int step) {
    report.expect(net->emb->weight.grad().defined() && !net->emb->weight.grad().is_sparse(),
                  "the tied weight's gradient is not dense at step " + std::to_string(step));
  });
  expect_parity(report, *net, *reference, *closed_form(EmbeddingNet(true)), kTolerance);
  report.end_case();
}

// 2 micro-steps under no_sync (sparse gradients accumulate locally,
// uncoalesced), then a synchronised one, twice.
void no_sync_accumulation(Report& report) {
  report.begin_case("no_sync: 2 micro-steps then a synced one, Embedding(sparse)");
  auto reference = closed_form(EmbeddingNet());
  auto net = closed_form(EmbeddingNet());
  ddp::DistributedDataParallel model(net);
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(kLearningRate));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int outer = 0; outer < 2; ++outer) {
    reference_optimizer.zero_grad();
    optimizer.zero_grad();
    for (int micro = 0; micro < 3; ++micro) {
      const int batch = outer * 3 + micro;
      torch::mse_loss(reference(ddp_test::rank_tokens(batch, 0, 1)),
                      ddp_test::global_batch(batch).second)
          .backward();
      auto loss = torch::mse_loss(model(ddp_test::rank_tokens(batch, rank(), world_size())),
                                  ddp_test::rank_batch(batch, rank(), world_size()).second);
      if (micro < 2) {
        auto guard = model->no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    const double difference =
        (net->emb->weight.grad().to_dense() - reference->emb->weight.grad().to_dense()).abs().max().item<double>();
    report.expect_at_most(difference, kTolerance,
                          "outer step " + std::to_string(outer) + " max |emb grad - reference|");
    reference_optimizer.step();
    optimizer.step();
  }
  expect_parity(report, *net, *reference, *closed_form(EmbeddingNet()), kTolerance);
  report.end_case();
}

// fp16 compression of a sparse bucket: the values travel as float16.
void fp16_compress(Report& report) {
  report.begin_case("comm hook fp16_compress, Embedding(sparse)");
  auto reference = closed_form(EmbeddingNet());
  auto net = closed_form(EmbeddingNet());
  ddp::DistributedDataParallel model(net);
  model->register_comm_hook(ddp::comm_hooks::fp16_compress());
  train_both(reference, model, [&](int step) {
    report.expect(net->emb->weight.grad().is_sparse() &&
                      net->emb->weight.grad().scalar_type() == torch::kFloat,
                  "the gradient is not a sparse Float after decompression at step " +
                      std::to_string(step));
  });
  // As the dense fp16 case of ddp_parity_main: float16's rounding, 5 steps.
  expect_parity(report, *net, *reference, *closed_form(EmbeddingNet()), 2e-4);
  report.end_case();
}

// ---- find_unused_parameters: a second table that only rank 0 reads, and a
// third that nobody does.

struct TwoTableNetImpl : torch::nn::Module {
  TwoTableNetImpl()
      : emb(register_module(
            "emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(ddp_test::kVocab, ddp_test::kIn).sparse(true)))),
        extra(register_module(
            "extra", torch::nn::Embedding(torch::nn::EmbeddingOptions(ddp_test::kVocab, ddp_test::kIn).sparse(true)))),
        idle(register_module(
            "idle", torch::nn::Embedding(torch::nn::EmbeddingOptions(ddp_test::kVocab, ddp_test::kIn).sparse(true)))),
        fc(register_module("fc", torch::nn::Linear(ddp_test::kIn, ddp_test::kOut))) {}

  torch::Tensor forward(torch::Tensor tokens, bool use_extra) {
    auto e = emb(tokens).mean(1);
    if (use_extra) {
      e = e + extra(tokens).mean(1);
    }
    return fc(torch::tanh(e));
  }

  torch::nn::Embedding emb, extra, idle;
  torch::nn::Linear fc;
};
TORCH_MODULE(TwoTableNet);

void unused_tables(Report& report) {
  report.begin_case("find_unused_parameters: a sparse table read by rank 0 only, one by nobody");
  auto net = closed_form(TwoTableNet());
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  auto group = ddp::default_process_group();
  const auto tokens = ddp_test::rank_tokens(0, rank(), world_size());
  const auto target = ddp_test::rank_batch(0, rank(), world_size()).second;
  // Rank 0's own gradient of `extra`, from a plain copy of the model.
  auto plain = closed_form(TwoTableNet());
  torch::mse_loss(plain(tokens, rank() == 0), target).backward();
  auto rank0_extra = plain->extra->weight.grad().defined() ? plain->extra->weight.grad().to_dense()
                                                           : torch::zeros_like(plain->extra->weight);
  group->broadcast(rank0_extra, {0})->wait();

  torch::mse_loss(model(tokens, rank() == 0), target).backward();
  const auto& extra_grad = net->extra->weight.grad();
  report.expect(extra_grad.defined() && extra_grad.is_sparse(),
                "extra (read on rank 0) has no sparse gradient on this rank");
  if (extra_grad.defined()) {
    const double difference =
        (extra_grad.to_dense() - rank0_extra / world_size()).abs().max().item<double>();
    report.expect_at_most(difference, 1e-6, "max |extra grad - rank 0's / W|");
  }
  report.expect(!net->idle->weight.grad().defined(),
                "idle (read by nobody) has a gradient; it should stay undefined");
  // A second step: every bucket is reduced again, nothing is owed.
  torch::mse_loss(model(tokens, rank() == 0), target).backward();
  report.expect(model->last_iteration_insight().iteration == 2, "the second iteration did not finish");
  report.end_case();
}

// ---- Layout and Join

void layout(Report& report) {
  report.begin_case("bucket layout: the sparse table in a bucket of its own");
  auto net = closed_form(EmbeddingNet());
  ddp::DistributedDataParallel model(net);
  auto before = model->bucket_layout();
  auto sparse_buckets = [](const std::vector<ddp::BucketInsight>& buckets) {
    std::vector<std::string> names;
    for (const auto& bucket : buckets) {
      if (bucket.sparse) {
        for (const auto& name : bucket.parameter_names) {
          names.push_back(name);
        }
      }
    }
    return names;
  };
  report.expect(before.size() == 2, "expected 2 buckets, got " + std::to_string(before.size()));
  report.expect(sparse_buckets(before) == std::vector<std::string>{"emb.weight"},
                "emb.weight is not alone in a sparse bucket");
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    torch::mse_loss(model(ddp_test::rank_tokens(step, rank(), world_size())),
                    ddp_test::rank_batch(step, rank(), world_size()).second)
        .backward();
    optimizer.step();
  }
  const auto insight = model->last_iteration_insight();
  report.expect(sparse_buckets(insight.buckets) == std::vector<std::string>{"emb.weight"},
                "after the rebuild, emb.weight is not alone in a sparse bucket");
  for (const auto& bucket : insight.buckets) {
    report.expect(bucket.bytes > 0, "bucket " + std::to_string(bucket.index) + " reports 0 bytes");
  }
  report.note(insight.to_string().substr(0, insight.to_string().find('\n')));
  report.end_case();
}

// Uneven inputs: rank r trains 2 + r batches; the ranks that finish shadow
// the others' sparse allreduces with empty gradients.
void join_uneven(Report& report) {
  report.begin_case("Join with uneven inputs, Embedding(sparse)");
  auto net = closed_form(EmbeddingNet());
  ddp::DistributedDataParallel model(net);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  {
    ddp::Join join(model);
    for (int step = 0; step < 2 + rank(); ++step) {
      optimizer.zero_grad();
      torch::mse_loss(model(ddp_test::rank_tokens(step, rank(), world_size())),
                      ddp_test::rank_batch(step, rank(), world_size()).second)
          .backward();
      optimizer.step();
    }
    join.finish();
  }
  const double spread = model->max_parameter_difference_across_ranks();
  report.expect(spread == 0, "the ranks' parameters differ by " + std::to_string(spread));
  report.note("parameters agree across ranks");
  report.end_case();
}

} // namespace

int main() {
  try {
    auto group = ddp::init_process_group();
    Report report("ddp_sparse_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    parity_embedding(report, "", {});
    parity_embedding(report, ", gradient_as_bucket_view, tiny buckets",
                     ddp::DistributedDataParallelOptions()
                         .gradient_as_bucket_view(true)
                         .first_bucket_cap_mb(0.0001)
                         .bucket_cap_mb(0.0001));
    parity_embedding_bag(report);
    parity_tied(report);
    no_sync_accumulation(report);
    fp16_compress(report);
    unused_tables(report);
    layout(report);
    join_uneven(report);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_sparse_main: %s\n", e.what());
    return 1;
  }
}
