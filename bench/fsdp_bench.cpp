// FullyShardedDataParallel against DistributedDataParallel: the time of a
// training step, and each rank's peak memory (docs/benchmarks.md, "Fully
// sharded data parallel").
//
// Usage:
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/fsdp_bench --mode speed
//       [--iters N] [--warmup N] [--rounds R]
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/fsdp_bench --mode memory
//       --variant ddp|fsdp-full|fsdp-grad-op [--width N] [--layers L]
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/fsdp_bench --mode speed
//       --device cuda --backend gloo|nccl [--batch N]
//   DDP_BACKEND=mpi mpirun -np 2 build/bench/fsdp_bench [...]
//
// speed: the 25M-parameter MLP of ddp_step_bench (4 x Linear(2500, 2500),
// ReLU between, batch 8, one intra-op thread, SGD lr 1e-3), in one launch:
//   ddp                     DDP, PyTorch's defaults (the anchor)
//   fsdp-full               FSDP kFullShard, each Linear a unit
//   fsdp-full-prefetch      the same with forward_prefetch
//   fsdp-grad-op            FSDP kShardGradOp
//   fsdp-grad-op-prefetch   the same with forward_prefetch
// rounds alternate them (R rounds, default 3, the order rotating), each
// variant's figure is the lowest of its per-round medians of the slowest
// rank's step times. Rank 0 prints one line per variant
//   fsdp_bench mode=speed backend=gloo world=2 variant=fsdp-full params=25010000 median_ms=... ratio=1.12 rounds_ms=...
// (ratio: to ddp's median in the same launch).
//
// --device cuda (speed): each rank's model and batch on cuda:LOCAL_RANK
// (modulo the GPUs), the device synchronised around each timed step, batch
// 512 by default; bench/gpu/fsdp_step_bench.py is PyTorch's FSDP on the
// same model and methodology (docs/gpu.md). --backend picks the group
// (gloo: ranks may share a GPU; nccl: one GPU per rank); by default
// init_process_group()'s.
//
// memory: L x Linear(W, W) (default 8 x Linear(4096, 4096), 134M
// parameters, 537 MB in float32), Adam, 3 steps of batch 4. Each rank
// reports the bytes of the parameters it holds (FSDP: its shards), of their
// gradients, of its optimizer state, its resident set before the model was
// built (the process: LibTorch, the group) and its peak resident set
// (getrusage's ru_maxrss, over the whole run: construction included);
// rank 0 prints for each rank
//   fsdp_bench mode=memory backend=gloo world=2 variant=fsdp-full params=... rank=R param_bytes=... grad_bytes=... state_bytes=... base_rss_mb=... peak_rss_mb=...
// Peak RSS is per process: launch each variant on its own.
//
// Exits 1 if a step fails, 2 on a bad command line.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "bench_util.h"

namespace {

constexpr int64_t kSpeedWidth = 2500;
constexpr int64_t kSpeedLayers = 4;
constexpr int64_t kSpeedBatch = 8;
constexpr int64_t kMemoryBatch = 4;

struct Config {
  std::string mode;
  std::string variant;
  int64_t width = 4096;
  int64_t layers = 8;
  int64_t iters = 10;
  int64_t warmup = 2;
  int64_t rounds = 3;
  std::string device = "cpu";
  std::string backend; // empty: init_process_group()'s choice
  int64_t batch = 0;   // 0: kSpeedBatch on the CPU, kSpeedBatchCuda on a GPU
};

constexpr int64_t kSpeedBatchCuda = 512;

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "fsdp_bench: %s\n"
               "usage: fsdp_bench --mode speed [--iters N] [--warmup N] [--rounds R]\n"
               "                  [--device cpu|cuda] [--backend gloo|nccl|mpi] [--batch N]\n"
               "       fsdp_bench --mode memory --variant ddp|fsdp-full|fsdp-grad-op [--width N] [--layers L]\n",
               message.c_str());
  std::exit(2);
}

Config parse_args(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage_error("missing value after '" + flag + "'");
    }
    const std::string value = argv[++i];
    auto count = [&](int64_t minimum) {
      int64_t parsed = 0;
      if (!ddp_bench::parse_count(value, minimum, parsed)) {
        usage_error(flag + " must be an integer >= " + std::to_string(minimum) + " (got '" + value + "')");
      }
      return parsed;
    };
    if (flag == "--mode") {
      config.mode = value;
    } else if (flag == "--variant") {
      config.variant = value;
    } else if (flag == "--width") {
      config.width = count(1);
    } else if (flag == "--layers") {
      config.layers = count(1);
    } else if (flag == "--iters") {
      config.iters = count(1);
    } else if (flag == "--warmup") {
      config.warmup = count(0);
    } else if (flag == "--rounds") {
      config.rounds = count(1);
    } else if (flag == "--device") {
      config.device = value;
    } else if (flag == "--backend") {
      config.backend = value;
    } else if (flag == "--batch") {
      config.batch = count(1);
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
  if (!config.backend.empty() && config.backend != "gloo" && config.backend != "nccl" && config.backend != "mpi") {
    usage_error("--backend must be gloo, nccl or mpi (got '" + config.backend + "')");
  }
  if (config.device == "cuda" && config.mode != "speed") {
    usage_error("--device cuda is for --mode speed (the memory mode measures the CPU's resident set)");
  }
  if (config.mode == "memory" && config.variant != "ddp" && config.variant != "fsdp-full" &&
      config.variant != "fsdp-grad-op") {
    usage_error("--mode memory needs --variant ddp, fsdp-full or fsdp-grad-op (got '" + config.variant + "')");
  }
  return config;
}

// One way of training the MLP: its forward and its optimizer.
struct Variant {
  std::string name;
  torch::nn::Sequential net;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::shared_ptr<torch::nn::Module> holder; // the DDP or FSDP module
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<double> medians; // per round
};

template <typename OptimizerType, typename Options>
Variant make_variant(const std::string& name, int64_t width, int64_t layers, const Options& optimizer_options,
                     const torch::Device& device = torch::kCPU) {
  torch::manual_seed(0);
  Variant v{name, ddp_bench::make_mlp(width, layers), nullptr, nullptr, nullptr, {}};
  v.net->to(device);
  if (name == "ddp") {
    auto ddp_options = ddp::DistributedDataParallelOptions();
    if (device.is_cuda()) {
      ddp_options.device_ids({device});
    }
    auto model = std::make_shared<ddp::DistributedDataParallel>(v.net, ddp_options);
    v.forward = [model](const torch::Tensor& x) { return (*model)(x); };
    v.optimizer = std::make_unique<OptimizerType>((*model)->parameters(), optimizer_options);
    v.holder = model->ptr();
    return v;
  }
  auto options = ddp::FullyShardedDataParallelOptions()
                     .sharding_strategy(name.rfind("fsdp-full", 0) == 0 ? ddp::ShardingStrategy::kFullShard
                                                                         : ddp::ShardingStrategy::kShardGradOp)
                     .forward_prefetch(name.find("prefetch") != std::string::npos);
  auto model = std::make_shared<ddp::FullyShardedDataParallel>(v.net, options);
  v.forward = [model](const torch::Tensor& x) { return (*model)(x); };
  v.optimizer = std::make_unique<OptimizerType>((*model)->parameters(), optimizer_options);
  v.holder = model->ptr();
  return v;
}

void step(Variant& v, const torch::Tensor& x, const torch::Tensor& y) {
  v.optimizer->zero_grad();
  torch::mse_loss(v.forward(x), y).backward();
  v.optimizer->step();
}


int run_speed(ddp::ProcessGroup& group, const Config& config, const torch::Device& device) {
  using Clock = std::chrono::steady_clock;
  const std::vector<std::string> names = {"ddp", "fsdp-full", "fsdp-full-prefetch", "fsdp-grad-op",
                                          "fsdp-grad-op-prefetch"};
  std::vector<Variant> variants;
  const int64_t params = ddp_bench::parameter_count(*ddp_bench::make_mlp(kSpeedWidth, kSpeedLayers));
  for (const auto& name : names) {
    variants.push_back(
        make_variant<torch::optim::SGD>(name, kSpeedWidth, kSpeedLayers, torch::optim::SGDOptions(1e-3), device));
  }
  const int64_t batch = config.batch > 0 ? config.batch : device.is_cuda() ? kSpeedBatchCuda : kSpeedBatch;
  torch::manual_seed(1 + group.rank());
  const auto x = torch::randn({batch, kSpeedWidth}).to(device);
  const auto y = torch::randn({batch, kSpeedWidth}).to(device);
  for (int64_t round = 0; round < config.rounds; ++round) {
    for (size_t k = 0; k < variants.size(); ++k) {
      auto& v = variants[(k + static_cast<size_t>(round)) % variants.size()];
      for (int64_t i = 0; i < config.warmup; ++i) {
        step(v, x, y);
      }
      std::vector<double> host;
      for (int64_t i = 0; i < config.iters; ++i) {
        ddp_bench::synchronize(device);
        const auto start = Clock::now();
        step(v, x, y);
        ddp_bench::synchronize(device);
        host.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
      const auto sorted = ddp_bench::slowest_rank_sorted(group, host, device);
      v.medians.push_back(sorted[sorted.size() / 2]);
    }
  }
  if (group.rank() == 0) {
    const double anchor = ddp_bench::lowest(variants[0].medians);
    for (const auto& v : variants) {
      const double best = ddp_bench::lowest(v.medians);
      const std::string rounds = ddp_bench::joined_ms(v.medians);
      std::printf("fsdp_bench mode=speed backend=%s world=%d%s variant=%s params=%lld median_ms=%.*f ratio=%.3f "
                  "rounds_ms=%s\n",
                  group.backend_name().c_str(), group.size(),
                  device.is_cuda() ? c10::str(" device=cuda batch=", batch).c_str() : "", v.name.c_str(),
                  static_cast<long long>(params), device.is_cuda() ? 3 : 1, best, best / anchor, rounds.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

int run_memory(ddp::ProcessGroup& group, const Config& config) {
  const double base_rss = ddp_bench::peak_rss_mb();
  const int64_t params = config.width * config.width * config.layers + config.width * config.layers;
  auto v = make_variant<torch::optim::Adam>(config.variant, config.width, config.layers,
                                            torch::optim::AdamOptions(1e-4));
  torch::manual_seed(1 + group.rank());
  const auto x = torch::randn({kMemoryBatch, config.width});
  const auto y = torch::randn({kMemoryBatch, config.width});
  for (int i = 0; i < 3; ++i) {
    step(v, x, y);
  }
  // What this rank holds: the DDP module's parameters, or FSDP's shards.
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  for (const auto& p : v.holder->parameters()) {
    param_bytes += static_cast<int64_t>(p.nbytes());
    grad_bytes += p.grad().defined() ? static_cast<int64_t>(p.grad().nbytes()) : 0;
  }
  auto mine = torch::tensor({static_cast<double>(param_bytes), static_cast<double>(grad_bytes),
                             static_cast<double>(ddp_bench::adam_state_bytes(*v.optimizer)), base_rss,
                             ddp_bench::peak_rss_mb()},
                            torch::kDouble);
  const auto all = ddp_bench::gather_figures(group, mine);
  if (group.rank() == 0) {
    for (int r = 0; r < group.size(); ++r) {
      const auto* f = all[static_cast<size_t>(r)].data_ptr<double>();
      std::printf("fsdp_bench mode=memory backend=%s world=%d variant=%s params=%lld rank=%d param_bytes=%.0f "
                  "grad_bytes=%.0f state_bytes=%.0f base_rss_mb=%.0f peak_rss_mb=%.0f\n",
                  group.backend_name().c_str(), group.size(), config.variant.c_str(),
                  static_cast<long long>(params), r, f[0], f[1], f[2], f[3], f[4]);
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
    const int status = config.mode == "speed" ? run_speed(*group, config, device) : run_memory(*group, config);
    ddp::destroy_process_group();
    return status;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "fsdp_bench: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_bench: %s\n", e.what());
  }
  return 1;
}
