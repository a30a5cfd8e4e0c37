// Time of one DistributedDataParallel training step on CUDA, ddp's half of a
// side-by-side benchmark; bench/gpu/ddp_step_bench.py is PyTorch's own
// DistributedDataParallel with the same model, batch and methodology. A
// program, never a timed test: docs/gpu.md gives the commands.
//
// Usage:
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/gpu_ddp_step_bench
//       [--backend nccl|gloo] [--model mlp|toy] [--width 4096] [--layers 4]
//       [--batch 64] [--iters 50] [--warmup 10] [--communicate-alone 1]
// prints on rank 0 one line
//   ddp_step_bench impl=ddp model=mlp backend=nccl world=2 params=67125248 batch=64 warmup=10 iters=50 median_ms=12.345 p10_ms=12.001 p90_ms=12.900
// and exits 0; 1 on an error, 2 on a bad command line, 77 without a GPU.
//
// How it measures: the model is `layers` Linear(width, width) + ReLU pairs
// (mlp), or the ToyModel of PyTorch's DDP tutorial, Linear(10, 10), ReLU,
// Linear(10, 5) (toy; --width and --layers are ignored), every rank on its own GPU (cuda:LOCAL_RANK), each step is zero_grad,
// forward on a random batch, MSE loss, backward (where DDP overlaps the
// gradient allreduce), and an SGD step; the device is synchronized before
// and after each timed step, and rank 0 reports the median and the 10th and
// 90th percentiles of the step times.
//
// With one rank DDP sends nothing: the mean of one gradient is itself, so
// ddp's built-in allreduce skips the collective (PyTorch's DDP still runs
// it). --communicate-alone 1 registers a communication hook that allreduces
// every bucket even then, so that one GPU can measure what the collectives
// add (the NCCL fingerprint check's cost, docs/gpu.md); the line then says
// hook=allreduce.

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ddp/ddp.h>


namespace {

struct Config {
  std::string backend = "nccl";
  std::string model = "mlp";
  int64_t width = 4096;
  int64_t layers = 4;
  int64_t batch = 64;
  int iters = 50;
  int warmup = 10;
  bool communicate_alone = false;
};

bool parse(int argc, char** argv, Config& config) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      return false;
    }
    const char* value = argv[++i];
    if (flag == "--backend") {
      config.backend = value;
    } else if (flag == "--model") {
      config.model = value;
    } else if (flag == "--width") {
      config.width = std::atoll(value);
    } else if (flag == "--layers") {
      config.layers = std::atoll(value);
    } else if (flag == "--batch") {
      config.batch = std::atoll(value);
    } else if (flag == "--iters") {
      config.iters = std::atoi(value);
    } else if (flag == "--warmup") {
      config.warmup = std::atoi(value);
    } else if (flag == "--communicate-alone") {
      config.communicate_alone = std::string(value) == "1";
    } else {
      return false;
    }
  }
  return (config.backend == "nccl" || config.backend == "gloo") &&
         (config.model == "mlp" || config.model == "toy") && config.width > 0 &&
         config.layers > 0 && config.batch > 0 && config.iters > 0 && config.warmup >= 0;
}

double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const size_t index = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

int run(const Config& config) {
  const int devices = static_cast<int>(torch::cuda::device_count());
  if (devices == 0) {
    std::printf("no CUDA device: this benchmark needs a GPU\n");
    return 77;
  }
  const auto info = ddp::world_info_from_env();
  const int device_index = info.local_rank % devices;
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  auto group = ddp::init_process_group(ddp::InitOptions().backend(
      config.backend == "nccl" ? ddp::Backend::kNccl : ddp::Backend::kGloo));

  torch::manual_seed(0);
  torch::nn::Sequential net;
  int64_t in_features = config.width;
  int64_t out_features = config.width;
  if (config.model == "toy") {
    in_features = 10;
    out_features = 5;
    net->push_back(torch::nn::Linear(in_features, 10));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(10, out_features));
  } else {
    for (int64_t l = 0; l < config.layers; ++l) {
      net->push_back(torch::nn::Linear(config.width, config.width));
      net->push_back(torch::nn::ReLU());
    }
  }
  net->to(device);
  int64_t params = 0;
  for (const auto& p : net->parameters()) {
    params += p.numel();
  }
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions().device_ids({device}));
  if (config.communicate_alone) {
    model->register_comm_hook([](ddp::ProcessGroup& g, ddp::GradBucket& bucket) {
      bucket.buffer().div_(g.size());
      return g.allreduce(bucket.buffer());
    });
  }
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  auto x = torch::randn({config.batch, in_features}, device);
  auto y = torch::randn({config.batch, out_features}, device);

  std::vector<double> times_ms;
  for (int i = 0; i < config.warmup + config.iters; ++i) {
    torch::cuda::synchronize(device_index);
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
    torch::cuda::synchronize(device_index);
    const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
    if (i >= config.warmup) {
      times_ms.push_back(elapsed.count());
    }
  }
  if (group->rank() == 0) {
    std::printf("ddp_step_bench impl=ddp model=%s backend=%s world=%d%s params=%lld batch=%lld "
                "warmup=%d iters=%d median_ms=%.3f p10_ms=%.3f p90_ms=%.3f\n",
                config.model.c_str(), config.backend.c_str(), group->size(),
                config.communicate_alone ? " hook=allreduce" : "", static_cast<long long>(params),
                static_cast<long long>(config.batch), config.warmup, config.iters,
                percentile(times_ms, 0.5), percentile(times_ms, 0.1), percentile(times_ms, 0.9));
  }
  ddp::destroy_process_group();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Config config;
  if (!parse(argc, argv, config)) {
    std::fprintf(stderr,
                 "usage: %s [--backend nccl|gloo] [--model mlp|toy] [--width N] [--layers N] [--batch N] "
                 "[--iters N] [--warmup N] [--communicate-alone 1]\n",
                 argv[0]);
    return 2;
  }
  try {
    return run(config);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "ddp_step_bench: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_step_bench: %s\n", e.what());
  }
  return 1;
}
