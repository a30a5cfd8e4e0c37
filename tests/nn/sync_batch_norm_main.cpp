// SyncBatchNorm against BatchNorm in one process: W ranks, each training a
// converted model (convert_sync_batchnorm, then DistributedDataParallel) on
// its slice of a global batch, must see at every step the output, the
// gradients, and after every step the parameters and running statistics,
// that one process gets with torch::nn::BatchNorm on the whole batch. The
// slices are uneven, one case gives a rank an empty batch, and one holds its
// BatchNorm as a custom module's member (synchronised where it stands). Then the
// eval-mode output, from the running statistics.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_sync_batch_norm_main
// prints one line per case on each rank, e.g.
//   [rank 1]: [ok] 1d linear, uneven slices [3 5]: max |ours - reference|
//             (at 1.running_var) 2.38e-07 (tolerance 1e-05), ...
// (on one line) and a summary; exits 1 if a case failed. Run alone (no
// launcher) it is a world of size 1, where SyncBatchNorm is BatchNorm.
// With the argument `cuda`, models and data live on cuda:LOCAL_RANK (modulo
// the GPUs present; exits 77 without one), e.g. on one GPU:
//   DDP_BACKEND=gloo build/ddprun --nproc-per-node 2 build/tests/ddp_sync_batch_norm_main cuda
//
// The loss of rank r is sum((out_r - y_r)^2) * W / E, with E the number of
// elements of the global batch's targets: DDP's average over the W ranks is
// then the reference's mean squared error, whatever the slices. Every rank trains the reference
// itself, from the same closed-form weights and data (tests/nn/closed_form.h).

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::Report;

constexpr int kSteps = 5;
constexpr double kLearningRate = 0.1;
// Float32 sums in another order; five steps move the weights far more.
constexpr double kTolerance = 1e-5;

struct Case {
  std::string name;
  // The model with torch::nn::BatchNorm layers.
  std::function<torch::nn::Sequential()> make;
  std::vector<int64_t> sample_shape;
  std::vector<int64_t> target_shape;
  // The samples of each rank, for worlds of 1, 2 and 3 ranks (larger
  // worlds split the same global batch evenly, the rest to the last rank).
  std::vector<std::vector<int64_t>> slices;
  // SyncBatchNorm modules in the converted model: a BatchNorm held as a
  // custom module's member stays one, synchronised where it stands.
  int64_t sync_batch_norm_modules = 1;
};

// A custom module that holds its BatchNorm as a typed member and calls it
// from its forward, as PyTorch's C++ DCGAN example holds its layers.
struct MemberBlockImpl : torch::nn::Module {
  MemberBlockImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)))),
        norm(register_module("norm", torch::nn::BatchNorm2d(4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(norm(conv(x)));
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d norm;
};
TORCH_MODULE(MemberBlock);

std::vector<int64_t> slices_of(const Case& c, int world_size) {
  if (world_size <= static_cast<int>(c.slices.size())) {
    return c.slices[static_cast<size_t>(world_size - 1)];
  }
  int64_t total = 0;
  for (auto n : c.slices[0]) {
    total += n;
  }
  std::vector<int64_t> sizes(static_cast<size_t>(world_size), total / world_size);
  sizes.back() += total % world_size;
  return sizes;
}

std::string describe(const std::vector<int64_t>& sizes) {
  std::string text;
  for (auto n : sizes) {
    text += (text.empty() ? "" : " ") + std::to_string(n);
  }
  return "[" + text + "]";
}

// Samples [first, first + count) of step `step`: element f of sample g is
// sin(0.9g + 0.37f + 0.2) + 0.3 (inputs) or cos(0.5g + 1.3f) (targets).
torch::Tensor closed_form_samples(int64_t first, int64_t count, std::vector<int64_t> shape,
                                  bool target) {
  int64_t per_sample = 1;
  for (auto d : shape) {
    per_sample *= d;
  }
  shape.insert(shape.begin(), count);
  return ddp_test::closed_form_tensor(shape, [=](int64_t n) {
    const double g = static_cast<double>(first + n / per_sample);
    const double f = static_cast<double>(n % per_sample);
    return target ? std::cos(0.5 * g + 1.3 * f) : std::sin(0.9 * g + 0.37 * f + 0.2) + 0.3;
  });
}

// The largest |a - b| seen so far, and where.
struct Worst {
  double value = 0;
  std::string where;

  void update(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
    if (a.numel() == 0) {
      return;
    }
    const double d =
        (a.detach().to(torch::kDouble) - b.detach().to(torch::kDouble)).abs().max().item<double>();
    if (std::getenv("SBN_MAG") && what.find("0.weight.grad") == 0) std::printf("%s |b|max %g d %g\n", what.c_str(), b.abs().max().item<double>(), d);
    if (d >= value || where.empty()) {
      value = d;
      where = what;
    }
  }
};

void run_case(Report& report, const Case& c, const torch::Device& device) {
  auto group = ddp::default_process_group();
  const int rank = group->rank();
  const int world_size = group->size();
  const auto sizes = slices_of(c, world_size);
  int64_t total = 0;
  int64_t first = 0;
  for (int r = 0; r < world_size; ++r) {
    if (r < rank) {
      first += sizes[static_cast<size_t>(r)];
    }
    total += sizes[static_cast<size_t>(r)];
  }
  const int64_t mine = sizes[static_cast<size_t>(rank)];
  report.begin_case(c.name + ", slices " + describe(sizes));

  auto reference = c.make();
  ddp_test::init_closed_form(*reference);
  reference->to(device);
  auto initial = c.make();
  ddp_test::init_closed_form(*initial);
  initial->to(device);
  auto net = c.make();
  ddp_test::init_closed_form(*net);
  net->to(device);
  ddp::nn::convert_sync_batchnorm(net);
  ddp::DistributedDataParallel model(net);
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(kLearningRate));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));

  Worst worst;
  for (int step = 0; step < kSteps; ++step) {
    const auto x = closed_form_samples(step * 100, total, c.sample_shape, false).to(device);
    const auto y = closed_form_samples(step * 100, total, c.target_shape, true).to(device);
    // The mean over the global batch's elements, on both sides.
    const double elements = static_cast<double>(y.numel());
    reference_optimizer.zero_grad();
    const auto out = reference->forward(x);
    ((out - y).square().sum() / elements).backward();

    const auto x_mine = x.narrow(0, first, mine);
    const auto y_mine = y.narrow(0, first, mine);
    optimizer.zero_grad();
    const auto out_mine = model(x_mine);
    ((out_mine - y_mine).square().sum() * (static_cast<double>(world_size) / elements)).backward();

    const std::string at_step = " at step " + std::to_string(step);
    worst.update(out_mine, out.narrow(0, first, mine), "the output" + at_step);
    const auto reference_parameters = reference->named_parameters();
    for (const auto& p : net->named_parameters()) {
      worst.update(p.value().grad(), reference_parameters[p.key()].grad(),
                   p.key() + ".grad" + at_step);
    }
    reference_optimizer.step();
    optimizer.step();
    for (const auto& p : net->named_parameters()) {
      worst.update(p.value(), reference_parameters[p.key()], p.key() + at_step);
    }
    const auto reference_buffers = reference->named_buffers();
    for (const auto& b : net->named_buffers()) {
      worst.update(b.value(), reference_buffers[b.key()], b.key() + at_step);
    }
  }

  // Eval mode: the running statistics, or without them the statistics of
  // this rank's own batch (as in PyTorch), and no communication.
  net->eval();
  reference->eval();
  {
    torch::NoGradGuard no_grad;
    const auto x = closed_form_samples(kSteps * 100, total, c.sample_shape, false).to(device);
    const auto x_mine = x.narrow(0, first, mine);
    const bool tracked = !net->buffers().empty();
    worst.update(net->forward(x_mine),
                 tracked ? reference->forward(x).narrow(0, first, mine) : reference->forward(x_mine),
                 "the eval-mode output");
  }

  report.expect_at_most(worst.value, kTolerance, "max |ours - reference| (at " + worst.where + ")");
  const auto moved = ddp_test::max_parameter_difference(*reference, *initial);
  report.expect(moved.value > 100 * kTolerance,
                "training barely moved the weights (" + Report::format(moved.value) +
                    "): the check proves nothing");
  report.note("training moved the weights by up to " + Report::format(moved.value));
  int64_t sync_batch_norms = 0;
  for (const auto& m : net->modules()) {
    sync_batch_norms += std::dynamic_pointer_cast<ddp::nn::SyncBatchNormImpl>(m) ? 1 : 0;
  }
  report.expect(sync_batch_norms == c.sync_batch_norm_modules,
                "the converted model has " + std::to_string(sync_batch_norms) + " SyncBatchNorm layers, expected " +
                    std::to_string(c.sync_batch_norm_modules));
  report.end_case();
}

std::vector<Case> cases() {
  using torch::nn::BatchNorm1d;
  using torch::nn::BatchNorm2d;
  using torch::nn::BatchNorm3d;
  using torch::nn::BatchNormOptions;
  auto conv2d = [] {
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
                                 BatchNorm2d(4), torch::nn::ReLU(),
                                 torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 2, 1)));
  };
  return {
      {"2d convolution", conv2d, {3, 4, 4}, {2, 4, 4}, {{6}, {3, 3}, {2, 2, 2}}},
      {"1d linear, uneven slices",
       [] {
         return torch::nn::Sequential(torch::nn::Linear(8, 16), BatchNorm1d(16), torch::nn::Tanh(),
                                      torch::nn::Linear(16, 4));
       },
       {8},
       {4},
       {{8}, {3, 5}, {3, 4, 1}}},
      {"2d convolution, a rank with an empty batch", conv2d, {3, 4, 4}, {2, 4, 4},
       {{7}, {0, 7}, {4, 0, 3}}},
      {"3d, cumulative average (momentum None), affine false",
       [] {
         return torch::nn::Sequential(
             torch::nn::Conv3d(torch::nn::Conv3dOptions(2, 3, 1)),
             BatchNorm3d(BatchNormOptions(3).momentum(c10::nullopt).affine(false)),
             torch::nn::ReLU(), torch::nn::Conv3d(torch::nn::Conv3dOptions(3, 1, 1)));
       },
       {2, 2, 2, 2},
       {1, 2, 2, 2},
       {{6}, {2, 4}, {1, 2, 3}}},
      {"1d on (N, C, L), no running statistics",
       [] {
         return torch::nn::Sequential(
             torch::nn::Conv1d(torch::nn::Conv1dOptions(2, 4, 1)),
             BatchNorm1d(BatchNormOptions(4).track_running_stats(false)), torch::nn::Tanh(),
             torch::nn::Conv1d(torch::nn::Conv1dOptions(4, 2, 1)));
       },
       {2, 5},
       {2, 5},
       {{6}, {5, 1}, {2, 2, 2}}},
      {"2d, BatchNorm held as a custom module's member",
       [] { return torch::nn::Sequential(MemberBlock(), torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 2, 1))); },
       {3, 4, 4},
       {2, 4, 4},
       {{7}, {2, 5}, {1, 4, 2}},
       0},
  };
}

} // namespace

int main(int argc, char** argv) {
  Report report("ddp_sync_batch_norm_main");
  torch::Device device(torch::kCPU);
  if (argc > 1 && std::string(argv[1]) == "cuda") {
    if (!torch::cuda::is_available()) {
      std::printf("ddp_sync_batch_norm_main: no CUDA device\n");
      return 77;
    }
    // Parity to 1e-5 needs float32 convolutions and products: TF32, which
    // cuDNN uses by default on recent GPUs, keeps 10 bits of mantissa, and
    // the 3d case's normalisation magnifies the difference between batch
    // splits beyond the tolerance.
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
    const auto gpus = static_cast<int>(torch::cuda::device_count());
    device = torch::Device(torch::kCUDA,
                           static_cast<c10::DeviceIndex>(ddp::world_info_from_env().local_rank % gpus));
  }
  try {
    ddp::init_process_group();
    for (const auto& c : cases()) {
      run_case(report, c, device);
    }
    ddp::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_sync_batch_norm_main: %s\n", e.what());
    return 1;
  }
  return report.finish();
}
