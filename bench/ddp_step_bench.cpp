// Time of one data-parallel training step on the CPU, ddp's half of a
// side-by-side benchmark. bench/ddp_step_bench.py is PyTorch's own
// DistributedDataParallel with the same models, batches and methodology, and
// bench/run_ddp_step_bench.py runs it, this program on ddp's Gloo and MPI
// backends, and the step without communication, and compares them (see
// docs/benchmarks.md).
//
// Usage:
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/ddp_step_bench
//       [--model toy|mlp] [--mode ddp|local|fsdp-full|fsdp-grad-op] [--batch N] [--iters N]
//       [--warmup N]
//       [--gradient-as-bucket-view 0|1]
//   DDP_BACKEND=mpi mpirun -np 2 build/bench/ddp_step_bench [...]
// prints on rank 0 one line
//   ddp_step_bench impl=ddp torch=1.13.0 blas=OpenBLAS blas_threads=1 backend=gloo model=toy mode=ddp world=2 params=165 batch=20 warmup=50 iters=500 median_ms=0.512 p10_ms=0.401 p90_ms=0.733 forward_ms=0.010 backward_ms=0.020 comm_ms=0.300 comm_wait_ms=0.280 overlap=0.05
// (the last six fields, medians over the timed steps of rank 0's
// `last_iteration_insight()`, only in mode=ddp; with
// --gradient-as-bucket-view 1 the line also says view=1) and exits 0. It exits 1 if a
// step fails, and 2 on a bad command line.
//
// The models (the same in ddp_step_bench.py):
//   toy: PyTorch's DDP tutorial ToyModel, Linear(10, 10), ReLU, Linear(10, 5);
//        batch 20.
//   mlp: 4 x Linear(2500, 2500) with a ReLU between them, 25,010,000
//        parameters (100 MB of float32 gradients); batch 8, which keeps a
//        step near 1 s with Debian's reference BLAS.
//
// How it measures:
//   1. One intra-op thread (two ranks share the cores), seed 0, one fixed
//      random batch per rank (seeded by the rank), MSE loss against a fixed
//      random target, SGD with lr 0.001 and PyTorch's DDP defaults
//      (bucket_cap_mb 25), unless --gradient-as-bucket-view 1, which sets
//      that DDP option (gradients are views into the buckets: no copy into
//      the bucket and back each step).
//   2. mode=ddp wraps the module in ddp::DistributedDataParallel;
//      mode=fsdp-full and fsdp-grad-op in ddp::FullyShardedDataParallel
//      (kFullShard, kShardGradOp; each Linear a unit), SGD over the shards
//      (bench/fsdp_bench compares them with DDP in one launch); mode=local
//      trains the plain module on every rank independently, with no
//      communication at all, so that the ranks still compete for the CPU as
//      in mode=ddp. The process group is used only before and after the
//      steps (a barrier, and collecting the times).
//   3. A step is zero_grad, forward, loss, backward, optimizer step. `warmup`
//      untimed steps, then `iters` timed steps, each timed alone, back to back
//      (no barrier between steps: DDP's own synchronisation is part of what
//      is measured).
//   4. The per-step times are allreduced with MAX (a synchronised step ends
//      when its slowest rank does) and rank 0 reports their median, 10th and
//      90th percentiles.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace {

// The models' shapes; the same constants are in ddp_step_bench.py.
constexpr int64_t kToyIn = 10;
constexpr int64_t kToyHidden = 10;
constexpr int64_t kToyOut = 5;
constexpr int64_t kToyBatch = 20;
constexpr int64_t kMlpWidth = 2500;
constexpr int64_t kMlpLayers = 4;
constexpr int64_t kMlpBatch = 8;
constexpr double kLearningRate = 0.001;

struct Config {
  std::string model = "toy";
  std::string mode = "ddp";
  int64_t batch = 0;   // 0: the model's default
  int64_t iters = 0;   // 0: the model's default
  int64_t warmup = -1; // -1: the model's default
  bool gradient_as_bucket_view = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "ddp_step_bench: %s\n"
               "usage: ddp_step_bench [--model toy|mlp] [--mode ddp|local|fsdp-full|fsdp-grad-op] [--batch N] "
               "[--iters N] [--warmup N] [--gradient-as-bucket-view 0|1]\n",
               message.c_str());
  std::exit(2);
}

// A non-negative integer; -1 if malformed.
int64_t parse_count(const std::string& text) {
  if (text.empty() || text.size() > 12 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(text);
}

Config parse_args(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage_error("missing value after '" + flag + "'");
    }
    const std::string value = argv[++i];
    if (flag == "--model") {
      if (value != "toy" && value != "mlp") {
        usage_error("--model must be toy or mlp (got '" + value + "')");
      }
      config.model = value;
    } else if (flag == "--mode") {
      if (value != "ddp" && value != "local" && value != "fsdp-full" && value != "fsdp-grad-op") {
        usage_error("--mode must be ddp, local, fsdp-full or fsdp-grad-op (got '" + value + "')");
      }
      config.mode = value;
    } else if (flag == "--batch" || flag == "--iters") {
      const int64_t count = parse_count(value);
      if (count <= 0) {
        usage_error(flag + " must be an integer >= 1 (got '" + value + "')");
      }
      (flag == "--batch" ? config.batch : config.iters) = count;
    } else if (flag == "--warmup") {
      config.warmup = parse_count(value);
      if (config.warmup < 0) {
        usage_error("--warmup must be an integer >= 0 (got '" + value + "')");
      }
    } else if (flag == "--gradient-as-bucket-view") {
      if (value != "0" && value != "1") {
        usage_error("--gradient-as-bucket-view must be 0 or 1 (got '" + value + "')");
      }
      config.gradient_as_bucket_view = value == "1";
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  const bool toy = config.model == "toy";
  if (config.batch == 0) {
    config.batch = toy ? kToyBatch : kMlpBatch;
  }
  if (config.iters == 0) {
    config.iters = toy ? 500 : 20;
  }
  if (config.warmup < 0) {
    config.warmup = toy ? 50 : 3;
  }
  return config;
}

torch::nn::Sequential make_model(const std::string& name) {
  torch::nn::Sequential net;
  if (name == "toy") {
    net->push_back(torch::nn::Linear(kToyIn, kToyHidden));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(kToyHidden, kToyOut));
    return net;
  }
  for (int64_t l = 0; l < kMlpLayers; ++l) {
    if (l > 0) {
      net->push_back(torch::nn::ReLU());
    }
    net->push_back(torch::nn::Linear(kMlpWidth, kMlpWidth));
  }
  return net;
}

// The value at quantile q of `sorted`: the nearest rank, rounding halves up.
double quantile(const std::vector<double>& sorted, double q) {
  const auto index = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(index, sorted.size() - 1)];
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return quantile(values, 0.5);
}

int run(const Config& config) {
  using Clock = std::chrono::steady_clock;
  auto pg = ddp::init_process_group();
  const bool toy = config.model == "toy";
  const bool use_ddp = config.mode == "ddp";

  torch::manual_seed(0);
  auto net = make_model(config.model);
  int64_t params = 0;
  for (const auto& p : net->parameters()) {
    params += p.numel();
  }
  // Constructed in mode=ddp only: construction broadcasts rank 0's state.
  std::optional<ddp::DistributedDataParallel> model;
  std::optional<ddp::FullyShardedDataParallel> fsdp;
  if (use_ddp) {
    model.emplace(net, ddp::DistributedDataParallelOptions().gradient_as_bucket_view(
                           config.gradient_as_bucket_view));
  } else if (config.mode != "local") {
    fsdp.emplace(net, ddp::FullyShardedDataParallelOptions().sharding_strategy(
                          config.mode == "fsdp-full" ? ddp::ShardingStrategy::kFullShard
                                                     : ddp::ShardingStrategy::kShardGradOp));
  }
  torch::optim::SGD optimizer(fsdp ? (*fsdp)->parameters() : net->parameters(), kLearningRate);
  torch::manual_seed(pg->rank() + 1);
  const int64_t in = toy ? kToyIn : kMlpWidth;
  const int64_t out = toy ? kToyOut : kMlpWidth;
  const auto x = torch::randn({config.batch, in});
  const auto y = torch::randn({config.batch, out});

  const int64_t iters = config.iters;
  auto ms = torch::empty({iters}, torch::kDouble);
  auto* ms_data = ms.data_ptr<double>();
  std::vector<double> forward_ms, backward_ms, comm_ms, comm_wait_ms, overlap;
  pg->barrier()->wait();
  for (int64_t i = 0; i < config.warmup + iters; ++i) {
    const auto start = Clock::now();
    optimizer.zero_grad();
    const auto output = use_ddp ? (*model)(x) : fsdp ? (*fsdp)(x) : net->forward(x);
    torch::mse_loss(output, y).backward();
    optimizer.step();
    const std::chrono::duration<double, std::milli> elapsed = Clock::now() - start;
    if (i < config.warmup) {
      continue;
    }
    ms_data[i - config.warmup] = elapsed.count();
    if (use_ddp) {
      const auto insight = (*model)->last_iteration_insight();
      forward_ms.push_back(insight.forward_ms);
      backward_ms.push_back(insight.backward_compute_ms);
      comm_ms.push_back(insight.comm_ms);
      comm_wait_ms.push_back(insight.comm_wait_ms);
      overlap.push_back(insight.overlap_fraction);
    }
  }
  pg->allreduce(ms, {ddp::ReduceOp::kMax})->wait();

  if (pg->rank() == 0) {
    std::vector<double> sorted(ms_data, ms_data + iters);
    std::sort(sorted.begin(), sorted.end());
    std::string insight;
    if (use_ddp) {
      char buffer[256];
      std::snprintf(buffer, sizeof(buffer),
                    " forward_ms=%.3f backward_ms=%.3f comm_ms=%.3f comm_wait_ms=%.3f overlap=%.2f",
                    median(forward_ms), median(backward_ms), median(comm_ms),
                    median(comm_wait_ms), median(overlap));
      insight = buffer;
    }
    std::printf("ddp_step_bench impl=ddp torch=%s blas=%s blas_threads=%d backend=%s model=%s mode=%s%s "
                "world=%d params=%lld batch=%lld warmup=%lld iters=%lld median_ms=%.3f "
                "p10_ms=%.3f p90_ms=%.3f%s\n",
                TORCH_VERSION, ddp::blas_in_use().token().c_str(), ddp::blas_num_threads(),
                pg->backend_name().c_str(), config.model.c_str(), config.mode.c_str(),
                config.gradient_as_bucket_view ? " view=1" : "", pg->size(),
                static_cast<long long>(params), static_cast<long long>(config.batch),
                static_cast<long long>(config.warmup), static_cast<long long>(iters),
                quantile(sorted, 0.5), quantile(sorted, 0.1), quantile(sorted, 0.9),
                insight.c_str());
    std::fflush(stdout);
  }
  model.reset();
  fsdp.reset();
  ddp::destroy_process_group();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const Config config = parse_args(argc, argv);
  try {
    // One intra-op thread, as the Python half: two ranks share the cores.
    at::set_num_threads(1);
    return run(config);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "ddp_step_bench: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_step_bench: %s\n", e.what());
  }
  return 1;
}
