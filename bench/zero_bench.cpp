// ZeroRedundancyOptimizer against DDP with a plain Adam: the time of a
// training step, and the memory each rank holds (docs/benchmarks.md,
// "Sharded optimizer state").
//
// Usage:
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/zero_bench --mode speed
//       [--iters N] [--warmup N] [--rounds R]
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/zero_bench --mode memory
//       --variant ddp-adam|zero1|zero2 [--width N] [--layers L]
//   DDP_BACKEND=mpi mpirun -np 2 build/bench/zero_bench [...]
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/zero_bench --mode speed
//       --device cuda --backend gloo|nccl [--batch N]
// (docs/benchmarks.md, "Sharded optimizer state", has the commands and the
// figures.)
//
// speed: the 25M-parameter MLP of ddp_step_bench (4 x Linear(2500, 2500),
// ReLU between, batch 8, one intra-op thread), Adam lr 1e-4, in one launch:
//   ddp-adam       DDP and torch::optim::Adam on every rank (the anchor)
//   zero1          DDP and ZeroRedundancyOptimizer<Adam>
//   zero1-overlap  the same, overlap_with(model)
//   zero2-overlap  stage 2 (gradients reduce-scattered), overlap_with(model)
// rounds alternate the four (R rounds, default 3, the order rotating), and
// each variant's figure is the lowest of its per-round medians. Rank 0
// prints one line per variant
//   zero_bench mode=speed backend=gloo world=2 variant=zero1 params=25010000 median_ms=... ratio=1.02
// (ratio: to ddp-adam's median in the same launch).
//
// memory: L x Linear(W, W) (L = 4, W = 5000 by default: 100,020,000 parameters;
// --layers 16 --width 2500: 100,040,000 in parameters of 25 MB),
// Adam, 3 steps of batch 4 under DDP (zero2: stage 2, overlapped). Each
// rank measures the bytes of its optimizer state (the sum of every state
// tensor's bytes), of the gradients it holds after the last backward
// (`.grad` defined), and its peak resident set (getrusage's ru_maxrss,
// which also counts DDP's gradient buckets, one copy of the gradients, and
// the step's temporaries); rank 0 prints
//   zero_bench mode=memory backend=gloo world=2 variant=zero1 params=100020000 largest_param_bytes=100000000 rank=R state_bytes=... grad_bytes=... peak_rss_mb=...
// for each rank. Peak RSS is per process: launch each variant on its own.
//
// --device cuda: each rank's model, batch and optimizer on cuda:LOCAL_RANK
// (modulo the GPUs), --backend gloo (ranks may share a GPU) or nccl (one GPU
// per rank; by default the group of init_process_group(), cpu:gloo,cuda:nccl
// with a GPU), the device synchronised around each timed step; the memory
// lines then add the GPU's peak of allocated bytes (gpu_peak_mb, from
// LibTorch's caching allocator). bench/gpu/zero_step_bench.py is PyTorch's
// ZeroRedundancyOptimizer with the same model and lines (docs/gpu.md).
//
// Exits 1 if a step fails, 2 on a bad command line.

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "bench_util.h"

#ifdef DDP_WITH_NCCL
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace {

constexpr int64_t kSpeedWidth = 2500;
constexpr int64_t kLayers = 4;
constexpr int64_t kSpeedBatch = 8;
constexpr int64_t kMemoryBatch = 4;
constexpr double kLearningRate = 1e-4;

struct Config {
  std::string mode;
  std::string variant;
  int64_t width = 5000;
  int64_t layers = 4;
  int64_t iters = 10;
  int64_t warmup = 2;
  int64_t rounds = 3;
  int64_t batch = 0; // 0: the mode's default
  std::string device = "cpu";
  std::string backend; // empty: init_process_group()'s choice
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "zero_bench: %s\n"
               "usage: zero_bench --mode speed [--iters N] [--warmup N] [--rounds R]\n"
               "       zero_bench --mode memory --variant ddp-adam|zero1|zero2 [--width N] [--layers L]\n"
               "       either with [--device cpu|cuda] [--backend gloo|nccl|mpi] [--batch N]\n",
               message.c_str());
  std::exit(2);
}

int64_t parse_count(const std::string& flag, const std::string& text, int64_t minimum) {
  int64_t value = 0;
  if (!ddp_bench::parse_count(text, minimum, value)) {
    usage_error(flag + " must be an integer >= " + std::to_string(minimum) + " (got '" + text + "')");
  }
  return value;
}

Config parse_args(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage_error("missing value after '" + flag + "'");
    }
    const std::string value = argv[++i];
    if (flag == "--mode") {
      config.mode = value;
    } else if (flag == "--variant") {
      config.variant = value;
    } else if (flag == "--width") {
      config.width = parse_count(flag, value, 1);
    } else if (flag == "--layers") {
      config.layers = parse_count(flag, value, 1);
    } else if (flag == "--iters") {
      config.iters = parse_count(flag, value, 1);
    } else if (flag == "--warmup") {
      config.warmup = parse_count(flag, value, 0);
    } else if (flag == "--rounds") {
      config.rounds = parse_count(flag, value, 1);
    } else if (flag == "--batch") {
      config.batch = parse_count(flag, value, 1);
    } else if (flag == "--device") {
      config.device = value;
    } else if (flag == "--backend") {
      config.backend = value;
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  if (config.mode != "speed" && config.mode != "memory") {
    usage_error("--mode must be speed or memory (got '" + config.mode + "')");
  }
  if (config.device != "cpu" && config.device != "cuda") {
    usage_error("--device must be cpu or cuda (got '" + config.device + "')");
  }
  if (!config.backend.empty() && config.backend != "gloo" && config.backend != "nccl" &&
      config.backend != "mpi") {
    usage_error("--backend must be gloo, nccl or mpi (got '" + config.backend + "')");
  }
  if (config.mode == "memory" && config.variant != "ddp-adam" && config.variant != "zero1" &&
      config.variant != "zero2") {
    usage_error("--mode memory needs --variant ddp-adam, zero1 or zero2 (got '" + config.variant + "')");
  }
  return config;
}

using ddp_bench::make_mlp;
using ddp_bench::parameter_count;
using ddp_bench::peak_rss_mb;

using Clock = std::chrono::steady_clock;

struct Variant {
  std::string name;
  torch::nn::Sequential net;
  std::shared_ptr<ddp::DistributedDataParallel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<double> medians; // per round
};

Variant make_variant(const std::string& name, int64_t width, bool bucket_view, int64_t layers,
                     const torch::Device& device) {
  torch::manual_seed(0);
  Variant v{name, make_mlp(width, layers), nullptr, nullptr, {}};
  v.net->to(device);
  auto ddp_options = ddp::DistributedDataParallelOptions().gradient_as_bucket_view(bucket_view);
  if (device.is_cuda()) {
    ddp_options.device_ids({device});
  }
  v.model = std::make_shared<ddp::DistributedDataParallel>(v.net, ddp_options);
  const auto options = torch::optim::AdamOptions(kLearningRate);
  if (name == "ddp-adam") {
    v.optimizer = std::make_unique<torch::optim::Adam>((*v.model)->parameters(), options);
  } else {
    const bool stage2 = name.rfind("zero2", 0) == 0;
    auto zero = std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam>>(
        (*v.model)->parameters(), options,
        ddp::optim::ZeroRedundancyOptimizerOptions().stage(stage2 ? 2 : 1));
    if (stage2 || name == "zero1-overlap") {
      zero->overlap_with(*v.model);
    }
    v.optimizer = std::move(zero);
  }
  return v;
}

void step(Variant& v, const torch::Tensor& x, const torch::Tensor& y) {
  v.optimizer->zero_grad();
  torch::mse_loss((*v.model)->forward(x), y).backward();
  v.optimizer->step();
}


// The per-step times of `iters` steps, each the slowest rank's.
std::vector<double> time_steps(ddp::ProcessGroup& group, Variant& v, const torch::Tensor& x,
                               const torch::Tensor& y, int64_t warmup, int64_t iters) {
  const auto device = x.device();
  for (int64_t i = 0; i < warmup; ++i) {
    step(v, x, y);
  }
  std::vector<double> host(static_cast<size_t>(iters));
  for (int64_t i = 0; i < iters; ++i) {
    ddp_bench::synchronize(device);
    const auto start = Clock::now();
    step(v, x, y);
    ddp_bench::synchronize(device);
    host[static_cast<size_t>(i)] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  return ddp_bench::slowest_rank_sorted(group, host, device);
}

int run_speed(ddp::ProcessGroup& group, const Config& config, const torch::Device& device) {
  const std::vector<std::string> names = {"ddp-adam", "zero1", "zero1-overlap", "zero2-overlap"};
  std::vector<Variant> variants;
  for (const auto& name : names) {
    variants.push_back(make_variant(name, kSpeedWidth, false, kLayers, device));
  }
  const int64_t batch = config.batch > 0 ? config.batch : kSpeedBatch;
  torch::manual_seed(1 + group.rank());
  const auto x = torch::randn({batch, kSpeedWidth}).to(device);
  const auto y = torch::randn({batch, kSpeedWidth}).to(device);
  for (int64_t round = 0; round < config.rounds; ++round) {
    for (size_t k = 0; k < variants.size(); ++k) {
      auto& v = variants[(k + static_cast<size_t>(round)) % variants.size()];
      const auto times = time_steps(group, v, x, y, config.warmup, config.iters);
      v.medians.push_back(times[times.size() / 2]);
    }
  }
  if (group.rank() == 0) {
    const double anchor = ddp_bench::lowest(variants[0].medians);
    for (const auto& v : variants) {
      const double best = ddp_bench::lowest(v.medians);
      const std::string rounds = ddp_bench::joined_ms(v.medians);
      std::printf("zero_bench mode=speed backend=%s world=%d%s variant=%s params=%lld median_ms=%.*f "
                  "ratio=%.3f rounds_ms=%s\n",
                  group.backend_name().c_str(), group.size(),
                  device.is_cuda() ? c10::str(" device=cuda batch=", batch).c_str() : "", v.name.c_str(),
                  static_cast<long long>(parameter_count(*v.net)), device.is_cuda() ? 3 : 1, best,
                  best / anchor, rounds.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

// The peak of the bytes LibTorch's caching allocator has handed out on
// `device` since the process started, in MB; 0 on the CPU.
double gpu_peak_mb(const torch::Device& device) {
#ifdef DDP_WITH_NCCL
  if (device.is_cuda()) {
    ddp_bench::synchronize(device);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1024.0 * 1024.0);
  }
#endif
  TORCH_CHECK(!device.is_cuda(), "zero_bench: the GPU's memory is measured in builds with the NCCL backend only");
  return 0.0;
}

int run_memory(ddp::ProcessGroup& group, const Config& config, const torch::Device& device) {
  auto v = make_variant(config.variant == "zero2" ? "zero2-overlap" : config.variant, config.width, false,
                        config.layers, device);
  const int64_t batch = config.batch > 0 ? config.batch : kMemoryBatch;
  torch::manual_seed(1 + group.rank());
  const auto x = torch::randn({batch, config.width}).to(device);
  const auto y = torch::randn({batch, config.width}).to(device);
  for (int i = 0; i < 3; ++i) {
    step(v, x, y);
  }
  torch::optim::Optimizer& holder =
      config.variant != "ddp-adam"
          ? static_cast<ddp::optim::ZeroRedundancyOptimizerBase&>(*v.optimizer).local_optimizer()
          : *v.optimizer;
  int64_t grad_bytes = 0;
  for (const auto& p : v.net->parameters()) {
    grad_bytes += p.grad().defined() ? static_cast<int64_t>(p.grad().nbytes()) : 0;
  }
  auto mine = torch::tensor({static_cast<double>(ddp_bench::adam_state_bytes(holder)), static_cast<double>(grad_bytes),
                             peak_rss_mb(), gpu_peak_mb(device)},
                            torch::kDouble)
                  .to(device);
  const auto all = ddp_bench::gather_figures(group, mine);
  if (group.rank() == 0) {
    int64_t largest = 0;
    for (const auto& p : v.net->parameters()) {
      largest = std::max<int64_t>(largest, static_cast<int64_t>(p.nbytes()));
    }
    for (int r = 0; r < group.size(); ++r) {
      const auto* f = all[static_cast<size_t>(r)].data_ptr<double>();
      std::printf("zero_bench mode=memory backend=%s world=%d variant=%s params=%lld "
                  "largest_param_bytes=%lld rank=%d state_bytes=%.0f grad_bytes=%.0f peak_rss_mb=%.0f%s\n",
                  group.backend_name().c_str(), group.size(), config.variant.c_str(),
                  static_cast<long long>(parameter_count(*v.net)), static_cast<long long>(largest), r, f[0],
                  f[1], f[2], device.is_cuda() ? c10::str(" gpu_peak_mb=", static_cast<int64_t>(f[3])).c_str() : "");
    }
    std::fflush(stdout);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const Config config = parse_args(argc, argv);
  try {
    torch::set_num_threads(1);
    const torch::Device device = ddp_bench::rank_device(config.device);
    auto group = ddp::init_process_group(ddp_bench::init_options_for(config.backend));
    const int status =
        config.mode == "speed" ? run_speed(*group, config, device) : run_memory(*group, config, device);
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_bench: %s\n", e.what());
    return 1;
  }
}
