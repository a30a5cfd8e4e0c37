#pragma once

// What the sharding benchmarks (zero_bench, fsdp_bench) share: the group and
// device a rank runs on, the MLP, counting parameters and optimizer state,
// the peak resident set, and the per-step times of the slowest rank.

#include <torch/cuda.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace ddp_bench {

/// `text` as an integer >= `minimum`; false if it is not one.
inline bool parse_count(const std::string& text, int64_t minimum, int64_t& value) {
  char* end = nullptr;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || parsed < minimum) {
    return false;
  }
  value = parsed;
  return true;
}

/// The options of init_process_group() for `--backend NAME` ("gloo", "nccl",
/// "mpi"; empty: init_process_group()'s own choice).
inline ddp::InitOptions init_options_for(const std::string& backend) {
  auto options = ddp::InitOptions();
  if (backend == "gloo") {
    options.backend(ddp::Backend::kGloo);
  } else if (backend == "nccl") {
    options.backend(ddp::Backend::kNccl);
  } else if (backend == "mpi") {
    options.backend(ddp::Backend::kMpi);
  }
  return options;
}

/// The device of this rank for `--device NAME`: the CPU, or for "cuda"
/// cuda:LOCAL_RANK modulo the GPUs. Throws when there is no GPU.
inline torch::Device rank_device(const std::string& device) {
  if (device != "cuda") {
    return torch::kCPU;
  }
  TORCH_CHECK(torch::cuda::is_available(), "--device cuda, but no CUDA device is visible");
  const auto info = ddp::world_info_from_env();
  return torch::Device(torch::kCUDA,
                       static_cast<c10::DeviceIndex>(info.local_rank % static_cast<int>(torch::cuda::device_count())));
}

/// Waits for the GPU's queued work when `device` is a GPU.
inline void synchronize(const torch::Device& device) {
  if (device.is_cuda()) {
    torch::cuda::synchronize(device.index());
  }
}

/// `layers` x Linear(width, width), a ReLU between them.
inline torch::nn::Sequential make_mlp(int64_t width, int64_t layers) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) {
      net->push_back(torch::nn::ReLU());
    }
  }
  return net;
}

inline int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) {
    count += p.numel();
  }
  return count;
}

/// The bytes of every tensor in `optimizer`'s state (Adam: exp_avg and
/// exp_avg_sq, and max_exp_avg_sq with amsgrad; step is a number).
inline int64_t adam_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    (void)key;
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      bytes += static_cast<int64_t>(adam->exp_avg().nbytes() + adam->exp_avg_sq().nbytes());
      if (adam->max_exp_avg_sq().defined()) {
        bytes += static_cast<int64_t>(adam->max_exp_avg_sq().nbytes());
      }
    }
  }
  return bytes;
}

/// This process's peak resident set since it started (getrusage's
/// ru_maxrss), in MB.
inline double peak_rss_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0; // KiB on Linux
}

/// Each step's time on the slowest rank (a synchronised step ends when its
/// slowest rank does), sorted. `host` holds this rank's times; the
/// allreduce runs on `device` (a pure NCCL group takes CUDA tensors only).
inline std::vector<double> slowest_rank_sorted(ddp::ProcessGroup& group, const std::vector<double>& host,
                                               const torch::Device& device) {
  auto times = torch::tensor(host, torch::kDouble).to(device);
  group.allreduce(times, {ddp::ReduceOp::kMax})->wait();
  times = times.cpu();
  std::vector<double> sorted(times.data_ptr<double>(), times.data_ptr<double>() + times.numel());
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

/// Every rank's `mine` (a 1-d tensor of figures), on the CPU, in rank order:
/// an allgather on `mine`'s device.
inline std::vector<torch::Tensor> gather_figures(ddp::ProcessGroup& group, const torch::Tensor& mine) {
  std::vector<torch::Tensor> all;
  for (int r = 0; r < group.size(); ++r) {
    all.push_back(torch::empty_like(mine));
  }
  group.allgather(all, mine)->wait();
  for (auto& t : all) {
    t = t.cpu();
  }
  return all;
}

/// The lowest of a variant's per-round medians: its figure.
inline double lowest(const std::vector<double>& medians) {
  return *std::min_element(medians.begin(), medians.end());
}

/// The per-round medians as "m1,m2,...", for the output line.
inline std::string joined_ms(const std::vector<double>& medians) {
  std::string text;
  for (const double m : medians) {
    text += (text.empty() ? "" : ",") + std::to_string(m).substr(0, 7);
  }
  return text;
}

} // namespace ddp_bench
