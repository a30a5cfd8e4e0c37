// Our side of the parity test against PyTorch's DistributedDataParallel
// (tests/nn/pytorch_parity_driver.py runs it and pytorch_ddp_reference.py,
// which trains the same models on the same data with torch.nn.parallel,
// and compares what rank 0 of each wrote).
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_pytorch_parity_main OUT_PREFIX \
//       [CONFIGURATION...]
// trains each configuration below with SGD (lr 0.2, momentum 0.5) on rank
// slices of the closed-form data, and on rank 0 (or the rank a
// configuration names) writes the final parameters and buffers to
// OUT_PREFIX.<configuration>.txt (one "name values..." line each, then
// "name.grad_defined 0|1" per parameter); for a module that DDP must
// refuse, it writes the error to OUT_PREFIX.<configuration>.error.txt.
// Exits 1 on an unexpected error. With CONFIGURATION names, runs only those.
//
// The configurations (each function below says what it checks), in the
// reference's order: mlp, powersgd_rank1, powersgd_rank2,
// powersgd_same_shape, batched_powersgd, post_local_sgd,
// post_local_sgd_optimizer, branch,
// unused_output, no_sync_buffers, join_buffers, join_unused, join_divide_active,
// ignored_params, no_parameters,
// frozen, two_forwards, embedding, embedding_bag, sync_batch_norm,
// sync_batch_norm_uneven, static_twice, static_unused, static_join,
// zero_adam, zero_sgd_groups, complex_params.

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/static_graph_models.h"

namespace {

constexpr int kSteps = 5;
// Uneven inputs (the Join configurations): rank r has 2 + r batches of
// kRowsPerBatch samples of its own.
constexpr int64_t kRowsPerBatch = 4;
constexpr int64_t kMaxRanks = 16;

int batches_of(int rank) {
  return 2 + rank;
}

std::pair<torch::Tensor, torch::Tensor> uneven_batch(int step, int rank) {
  return ddp_test::samples((step * kMaxRanks + rank) * kRowsPerBatch, kRowsPerBatch);
}

// Must match pytorch_ddp_reference.py's TwoHeadNet: two outputs, of which
// the loss uses `b`'s only.
struct TwoHeadNetImpl : torch::nn::Module {
  TwoHeadNetImpl()
      : trunk(register_module("trunk", torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden))),
        a(register_module("a", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))),
        b(register_module("b", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))) {}

  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    auto h = torch::tanh(trunk(x));
    return {a(h), b(h)};
  }

  torch::nn::Linear trunk, a, b;
};
TORCH_MODULE(TwoHeadNet);

// Must match pytorch_ddp_reference.py's SwitchNet: `extra` is used when the
// caller says so.
struct SwitchNetImpl : torch::nn::Module {
  SwitchNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(ddp_test::kIn, ddp_test::kHidden))),
        extra(register_module("extra", torch::nn::Linear(ddp_test::kHidden, ddp_test::kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))) {}

  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    auto h = torch::relu(fc1(x));
    if (use_extra) {
      h = h + torch::tanh(extra(h));
    }
    return fc2(h);
  }

  torch::nn::Linear fc1, extra, fc2;
};
TORCH_MODULE(SwitchNet);

// A complex weight beside real ones: the magnitudes of x w, then a Linear.
struct ComplexNetImpl : torch::nn::Module {
  ComplexNetImpl()
      : w(register_parameter("w", torch::zeros({ddp_test::kIn, ddp_test::kHidden}, torch::kComplexFloat))),
        fc(register_module("fc", torch::nn::Linear(ddp_test::kHidden, ddp_test::kOut))) {}

  torch::Tensor forward(torch::Tensor x) {
    return fc(torch::matmul(x.to(torch::kComplexFloat), w).abs());
  }

  torch::Tensor w;
  torch::nn::Linear fc;
};
TORCH_MODULE(ComplexNet);

torch::optim::SGD make_sgd(ddp::DistributedDataParallel& model) {
  return torch::optim::SGD(model->parameters(), torch::optim::SGDOptions(0.2).momentum(0.5));
}

// What PyTorch's `optimizer.zero_grad(set_to_none=True)` does, whichever
// LibTorch this is (1.13's zero_grad() zeroes in place, 2.x's sets to none).
void set_grads_to_none(torch::nn::Module& module) {
  for (auto& p : module.parameters()) {
    p.mutable_grad() = torch::Tensor();
  }
}

int rank() {
  return ddp::default_process_group()->rank();
}

int world_size() {
  return ddp::default_process_group()->size();
}

// Rank `writer` writes the state and which gradients are defined; false
// on an I/O error.
bool write_result(const torch::nn::Module& net, const std::string& path, int writer = 0) {
  if (rank() != writer) {
    return true;
  }
  bool ok = ddp_test::write_state_text(net, path);
  if (std::FILE* file = std::fopen(path.c_str(), "a")) {
    for (const auto& p : net.named_parameters()) {
      std::fprintf(file, "%s.grad_defined %d\n", p.key().c_str(),
                   p.value().grad().defined() ? 1 : 0);
    }
    ok = std::fclose(file) == 0 && ok;
  } else {
    ok = false;
  }
  if (!ok) {
    std::fprintf(stderr, "ddp_pytorch_parity_main: cannot write %s\n", path.c_str());
    return false;
  }
  std::printf("wrote %s\n", path.c_str());
  return true;
}

// kSteps steps of the MLP's loss on this rank's batches; `after_step`, when
// given, runs after each optimizer step.
void train_steps(ddp::DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                 const std::function<void()>& after_step = nullptr) {
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, rank(), world_size());
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
    if (after_step) {
      after_step();
    }
  }
}

// mlp, branch: plain training, zero_grad() as each LibTorch does it (the
// reference's zero_grad() does the same in the matching PyTorch).
template <typename Net>
bool train_and_write(Net net, const ddp::DistributedDataParallelOptions& options,
                     const std::string& path) {
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options);
  auto optimizer = make_sgd(model);
  train_steps(model, optimizer);
  return write_result(*net, path);
}

// embedding, embedding_bag: sparse gradients (closed_form.h's EmbeddingNet
// and EmbeddingBagNet, sparse(true)), which DDP reduces with Gloo's sparse
// allreduce; the model reads this rank's tokens.
template <typename Net>
bool train_tokens(Net net, const std::string& path) {
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_sgd(model);
  for (int step = 0; step < kSteps; ++step) {
    const auto target = ddp_test::rank_batch(step, rank(), world_size()).second;
    optimizer.zero_grad();
    torch::mse_loss(model(ddp_test::rank_tokens(step, rank(), world_size())), target).backward();
    optimizer.step();
  }
  return write_result(*net, path);
}

// unused_output: the forward returns (a(h), b(h)) and the loss uses b's only;
// with find_unused_parameters, `a` counts as unused (its gradient stays
// undefined) and every other gradient is reduced.
bool unused_output(const std::string& path) {
  TwoHeadNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(
      net, ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  auto optimizer = make_sgd(model);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, rank(), world_size());
    set_grads_to_none(*net);
    auto outputs = model.forward<std::tuple<torch::Tensor, torch::Tensor>>(x);
    torch::mse_loss(std::get<1>(outputs), y).backward();
    optimizer.step();
  }
  return write_result(*net, path);
}

// no_sync_buffers: 2 outer steps, each: a forward without gradients (which
// updates the statistics too, in training mode), 2 micro-steps under
// no_sync, then a synchronised one, on a BatchNorm model: buffers are
// broadcast only before a forward that follows a synchronised one (with
// gradients, outside no_sync). The last rank writes, since the broadcasts
// never change rank 0's own statistics.
bool no_sync_buffers(const std::string& path) {
  auto net = ddp_test::make_bn_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_sgd(model);
  for (int outer = 0; outer < 2; ++outer) {
    {
      torch::NoGradGuard no_grad;
      model(ddp_test::rank_batch(10 + outer, rank(), world_size()).first);
    }
    set_grads_to_none(*net);
    for (int micro = 0; micro < 3; ++micro) {
      auto [x, y] = ddp_test::rank_batch(outer * 3 + micro, rank(), world_size());
      if (micro < 2) {
        auto guard = model->no_sync();
        torch::mse_loss(model(x), y).backward();
      } else {
        torch::mse_loss(model(x), y).backward();
      }
    }
    optimizer.step();
  }
  return write_result(*net, path, world_size() - 1);
}

// Trains `model` under ddp::Join on this rank's uneven batches.
void train_uneven(torch::nn::Module& net, ddp::DistributedDataParallel& model,
                  const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                  const ddp::JoinOptions& options = {}) {
  auto optimizer = make_sgd(model);
  ddp::Join join(model, options);
  for (int step = 0; step < batches_of(rank()); ++step) {
    auto [x, y] = uneven_batch(step, rank());
    set_grads_to_none(net);
    torch::mse_loss(forward(x), y).backward();
    optimizer.step();
  }
  join.finish();
}

// join_buffers: a BatchNorm model under Join, rank r with 2 + r batches:
// buffers come from the highest rank still training.
bool join_buffers(const std::string& path) {
  auto net = ddp_test::make_bn_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  train_uneven(*net, model, [&](const torch::Tensor& x) { return model(x); });
  return write_result(*net, path);
}

// join_divide_active: the MLP under Join with
// divide_by_initial_world_size(false): each step's gradients averaged over
// the ranks still training.
bool join_divide_active(const std::string& path) {
  auto net = ddp_test::make_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  train_uneven(
      *net, model, [&](const torch::Tensor& x) { return model(x); },
      ddp::JoinOptions().divide_by_initial_world_size(false));
  return write_result(*net, path);
}

// join_unused: rank 0 alone uses `extra`, and joins first; its last usage
// map keeps counting `extra` as used, so the ranks still training get a zero
// gradient there (which momentum then applies).
bool join_unused(const std::string& path) {
  SwitchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(
      net, ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  const bool use_extra = rank() == 0;
  train_uneven(*net, model, [&](const torch::Tensor& x) { return model(x, use_extra); });
  return write_result(*net, path);
}

// static_join: join_unused with static_graph: each rank's graph is fixed
// (rank 0 alone uses `extra`), and rank 0 joins first; the first
// iteration's usage counts `extra` as used for good.
bool static_join(const std::string& path) {
  SwitchNet net;
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions().static_graph(true));
  const bool use_extra = rank() == 0;
  train_uneven(*net, model, [&](const torch::Tensor& x) { return model(x, use_extra); });
  return write_result(*net, path);
}

// no_parameters, frozen: a module with nothing to train must be refused.
template <typename Net>
bool refused(Net net, const std::string& path) {
  try {
    ddp::DistributedDataParallel model(net);
  } catch (const c10::Error& e) {
    if (rank() == 0) {
      const std::string error_path = path.substr(0, path.size() - 4) + ".error.txt";
      std::FILE* file = std::fopen(error_path.c_str(), "w");
      if (file == nullptr) {
        return false;
      }
      std::fprintf(file, "%s\n", e.msg().c_str());
      std::printf("refused: %s\n", e.msg().c_str());
      return std::fclose(file) == 0;
    }
    return true;
  }
  std::printf("accepted a module with nothing to train\n");
  return true; // the driver reports it
}

torch::nn::Sequential frozen_mlp() {
  auto net = ddp_test::make_mlp();
  for (auto& p : net->parameters()) {
    p.set_requires_grad(false);
  }
  return net;
}

// two_forwards: two forwards of a BatchNorm model, then one backward of both
// losses (the second forward's buffer broadcast must not break the first's
// graph). PyTorch 1.13 and 2.11 raise "modified by an inplace operation"
// here (PyTorch issue 175024); the reference then writes the one-process
// result instead (its two_forwards_one_process: the average of the ranks'
// gradients, rank 0's running statistics) and a note, and the driver
// compares ours with that. A PyTorch that trains it gives its own numbers.
bool two_forwards(const std::string& path) {
  auto net = ddp_test::make_bn_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_sgd(model);
  for (int step = 0; step < kSteps; ++step) {
    set_grads_to_none(*net);
    auto [x1, y1] = ddp_test::rank_batch(2 * step, rank(), world_size());
    auto [x2, y2] = ddp_test::rank_batch(2 * step + 1, rank(), world_size());
    auto out1 = model(x1);
    auto out2 = model(x2);
    (torch::mse_loss(out1, y1) + torch::mse_loss(out2, y2)).backward();
    optimizer.step();
  }
  return write_result(*net, path);
}

// sync_batch_norm: the BatchNorm MLP with its BatchNorm1d converted to a
// ddp::nn::SyncBatchNorm, on the even rank slices: the statistics are those
// of the global batch. PyTorch's SyncBatchNorm refuses CPU tensors, so the
// reference runs PyTorch's own SyncBatchNorm autograd function (its
// collectives over gloo, under PyTorch's DDP) with its five CUDA-only
// kernels computed on the CPU from their definitions (see
// pytorch_ddp_reference.py, "SyncBatchNorm").
bool sync_batch_norm(const std::string& path) {
  auto net = ddp_test::make_bn_mlp();
  ddp_test::init_closed_form(*net);
  ddp::nn::convert_sync_batchnorm(net);
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_sgd(model);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, rank(), world_size());
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
  }
  return write_result(*net, path);
}

// sync_batch_norm_uneven: a SyncBatchNorm2d on 4-D input (the kIn features
// of a sample as 2 x 2 x 2) over uneven slices of a global batch of
// kSyncBatch samples: [3 5] on 2 ranks, [3 0 5] on 3 (an empty rank), even
// otherwise. Must match pytorch_ddp_reference.py's make_conv_bn and
// sync_slices. Rank r's loss is its squared error times W over the global
// batch's target elements, so that DDP's average is the global mean.
constexpr int64_t kSyncBatch = 8;

std::vector<int64_t> sync_slices(int world_size) {
  if (world_size == 2) {
    return {3, 5};
  }
  if (world_size == 3) {
    return {3, 0, 5};
  }
  std::vector<int64_t> sizes(static_cast<size_t>(world_size), kSyncBatch / world_size);
  sizes.back() += kSyncBatch % world_size;
  return sizes;
}

torch::nn::Sequential make_conv_bn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 1)),
                               torch::nn::BatchNorm2d(4), torch::nn::ReLU(), torch::nn::Flatten(),
                               torch::nn::Linear(16, ddp_test::kOut));
}

bool sync_batch_norm_uneven(const std::string& path) {
  auto net = make_conv_bn();
  ddp_test::init_closed_form(*net);
  ddp::nn::convert_sync_batchnorm(net);
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_sgd(model);
  const auto sizes = sync_slices(world_size());
  int64_t first = 0;
  for (int r = 0; r < rank(); ++r) {
    first += sizes[static_cast<size_t>(r)];
  }
  const int64_t count = sizes[static_cast<size_t>(rank())];
  const double scale = static_cast<double>(world_size()) / static_cast<double>(kSyncBatch * ddp_test::kOut);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::samples(step * kSyncBatch + first, count);
    optimizer.zero_grad();
    ((model(x.reshape({count, 2, 2, 2})) - y).square().sum() * scale).backward();
    optimizer.step();
  }
  return write_result(*net, path);
}

// powersgd_rank1, powersgd_rank2: the MLP with the PowerSGD hook at rank 1
// and 2 (PyTorch's powerSGD_hook in the reference), start_powerSGD_iter 2:
// two plain steps, then three compressed ones with error feedback and warm
// start, from the random Q that PyTorch draws for seed 0. At rank 2 the last
// layer (4 x 16) is not worth compressing and goes uncompressed.
// powersgd_same_shape: rank 1 with batch_tensors_with_same_shape (the two
// 16 x 16 weights compressed as one batch). batched_powersgd: the hook that
// compresses the whole bucket as one padded square matrix (PyTorch's
// batched_powerSGD_hook, with its 2-D orthogonalization fixed: see the
// reference). post_local_sgd: post_localSGD_hook with local groups of one
// rank from step 2, and a PeriodicModelAverager (period 2, warmup 2).
bool train_hooked(ddp::CommHook hook, const std::string& path,
                  std::shared_ptr<ddp::model_averaging::PeriodicModelAverager> averager = nullptr) {
  auto net = ddp_test::make_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  model->register_comm_hook(std::move(hook));
  auto optimizer = make_sgd(model);
  train_steps(model, optimizer, [&] {
    if (averager) {
      averager->average_parameters(model->parameters());
    }
  });
  return write_result(*net, path);
}

bool powersgd(ddp::comm_hooks::PowerSGDOptions options, bool batched, const std::string& path) {
  auto state = std::make_shared<ddp::comm_hooks::PowerSGDState>(options.start_powerSGD_iter(2));
  return train_hooked(batched ? ddp::comm_hooks::batched_powerSGD(state) : ddp::comm_hooks::powerSGD(state), path);
}

bool powersgd(int64_t matrix_rank, const std::string& path) {
  return powersgd(ddp::comm_hooks::PowerSGDOptions().matrix_approximation_rank(matrix_rank), false, path);
}

// post_local_sgd_optimizer: the same through PostLocalSGDOptimizer (the
// optimizer steps, then averages).
bool post_local_sgd_optimizer(const std::string& path) {
  auto net = ddp_test::make_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  auto state = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, ddp::new_subgroups(1).mine, 2);
  model->register_comm_hook(ddp::comm_hooks::post_localSGD(state));
  ddp::optim::PostLocalSGDOptimizer optimizer(
      std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.2).momentum(0.5)),
      std::make_shared<ddp::model_averaging::PeriodicModelAverager>(2, 2));
  train_steps(model, optimizer);
  return write_result(*net, path);
}

bool post_local_sgd(const std::string& path) {
  auto state = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, ddp::new_subgroups(1).mine, 2);
  return train_hooked(ddp::comm_hooks::post_localSGD(state), path,
                      std::make_shared<ddp::model_averaging::PeriodicModelAverager>(2, 2));
}

} // namespace

// zero_adam, zero_sgd_groups: ZeroRedundancyOptimizer under DDP against
// PyTorch's own (torch.distributed.optim.ZeroRedundancyOptimizer): Adam,
// and SGD with momentum and weight decay over two groups with the
// parameters as bucket views.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(ddp::DistributedDataParallel& model)>;

bool train_mlp_with(const OptimizerFactory& make_optimizer, const std::string& path) {
  auto net = ddp_test::make_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_optimizer(model);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, rank(), world_size());
    optimizer->zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer->step();
  }
  return write_result(*net, path);
}

bool zero_adam(const std::string& path) {
  return train_mlp_with(
      [](ddp::DistributedDataParallel& model) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam>>(
            model->parameters(), torch::optim::AdamOptions(1e-2));
      },
      path);
}

bool zero_sgd_groups(const std::string& path) {
  return train_mlp_with(
      [](ddp::DistributedDataParallel& model) -> std::unique_ptr<torch::optim::Optimizer> {
        const auto params = model->parameters();
        std::vector<torch::optim::OptimizerParamGroup> groups;
        groups.emplace_back(std::vector<torch::Tensor>(params.begin(), params.begin() + 4));
        groups.emplace_back(std::vector<torch::Tensor>(params.begin() + 4, params.end()),
                            std::make_unique<torch::optim::SGDOptions>(
                                torch::optim::SGDOptions(0.02).momentum(0.9).weight_decay(1e-3)));
        return std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD>>(
            std::move(groups), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3),
            ddp::optim::ZeroRedundancyOptimizerOptions().parameters_as_bucket_view(true));
      },
      path);
}

// complex_params: a complex parameter, whose gradient DDP's buckets reduce
// as pairs of reals (Note [Complex arguments]), beside real ones. The real
// parts of w are init_closed_form's; both parts are set here, as the
// reference sets them.
bool complex_params(const std::string& path) {
  ComplexNet net;
  ddp_test::init_closed_form(*net);
  {
    torch::NoGradGuard no_grad;
    torch::view_as_real(net->w).copy_(ddp_test::closed_form_tensor(
        {ddp_test::kIn, ddp_test::kHidden, 2},
        [](int64_t n) { return 0.1 * std::sin(5.0 * static_cast<double>(n) + 0.5) + 0.05; }));
  }
  ddp::DistributedDataParallel model(net);
  auto optimizer = make_sgd(model);
  train_steps(model, optimizer);
  return write_result(*net, path);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ddp_pytorch_parity_main OUT_PREFIX [CONFIGURATION...]\n");
    return 2;
  }
  const std::string prefix = argv[1];
  const std::vector<std::string> only(argv + 2, argv + argc);
  using Run = std::function<bool(const std::string& path)>;
  const std::vector<std::pair<std::string, Run>> configurations = {
      {"mlp",
       [](const std::string& path) { return train_and_write(ddp_test::make_mlp(), {}, path); }},
      {"powersgd_rank1", [](const std::string& path) { return powersgd(1, path); }},
      {"powersgd_rank2", [](const std::string& path) { return powersgd(2, path); }},
      {"powersgd_same_shape",
       [](const std::string& path) {
         return powersgd(ddp::comm_hooks::PowerSGDOptions().batch_tensors_with_same_shape(true), false, path);
       }},
      {"batched_powersgd",
       [](const std::string& path) { return powersgd(ddp::comm_hooks::PowerSGDOptions(), true, path); }},
      {"post_local_sgd", post_local_sgd},
      {"post_local_sgd_optimizer", post_local_sgd_optimizer},
      {"branch",
       [](const std::string& path) {
         return train_and_write(ddp_test::BranchNet(),
                                ddp::DistributedDataParallelOptions()
                                    .find_unused_parameters(true)
                                    .gradient_as_bucket_view(true),
                                path);
       }},
      {"unused_output", unused_output},
      {"no_sync_buffers", no_sync_buffers},
      {"join_buffers", join_buffers},
      {"join_unused", join_unused},
      {"join_divide_active", join_divide_active},
      {"ignored_params",
       [](const std::string& path) {
         return train_and_write(ddp_test::make_mlp(),
                                ddp::DistributedDataParallelOptions().params_and_buffers_to_ignore({"0.weight", "0.bias"}),
                                path);
       }},
      {"no_parameters",
       [](const std::string& path) {
         return refused(torch::nn::Sequential(torch::nn::ReLU()), path);
       }},
      {"frozen", [](const std::string& path) { return refused(frozen_mlp(), path); }},
      {"two_forwards", two_forwards},
      {"embedding",
       [](const std::string& path) { return train_tokens(ddp_test::EmbeddingNet(), path); }},
      {"embedding_bag",
       [](const std::string& path) { return train_tokens(ddp_test::EmbeddingBagNet(), path); }},
      {"sync_batch_norm", sync_batch_norm},
      {"sync_batch_norm_uneven", sync_batch_norm_uneven},
      // static_graph: a layer run twice under reentrant checkpoints (its
      // hooks fire twice per backward), and a layer never used.
      {"static_twice",
       [](const std::string& path) {
         return train_and_write(ddp_test::TwiceNet(),
                                ddp::DistributedDataParallelOptions().static_graph(true), path);
       }},
      {"static_unused",
       [](const std::string& path) {
         return train_and_write(ddp_test::BranchNet(),
                                ddp::DistributedDataParallelOptions()
                                    .static_graph(true)
                                    .gradient_as_bucket_view(true),
                                path);
       }},
      {"static_join", static_join},
      {"zero_adam", zero_adam},
      {"zero_sgd_groups", zero_sgd_groups},
      {"complex_params", complex_params},
  };
  try {
    ddp::init_process_group();
    bool ok = true;
    for (const auto& [name, run] : configurations) {
      if (only.empty() || std::find(only.begin(), only.end(), name) != only.end()) {
        ok = run(prefix + "." + name + ".txt") && ok;
      }
    }
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_pytorch_parity_main: %s\n", e.what());
    return 1;
  }
}
