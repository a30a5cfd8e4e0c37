// What the flight recorder costs: the same work on two subgroups of all the
// ranks, one recording (the default, DDP_FLIGHT_RECORDER_SIZE unset) and one
// not (created with DDP_FLIGHT_RECORDER_SIZE=0), alternating round by round
// in one launch (docs/benchmarks.md, "Flight recorder").
//
// Usage:
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/flight_recorder_bench
//       [--iters N] [--rounds R]
//   DDP_BACKEND=mpi mpirun -np 2 build/bench/flight_recorder_bench [...]
//
// Two cases, each the figure that the recorder's cost is largest against:
//   allreduce  one float32 allreduce (latency-bound: no collective is cheaper)
//   toy-step   a DDP step of the tutorial's ToyModel (Linear(10, 10), ReLU,
//              Linear(10, 5); batch 20, MSE, SGD): the README's main job
// Each figure is the lowest of the per-round medians of N iterations; rank 0
// prints per case and recorder state
//   flight_recorder_bench backend=gloo world=2 case=toy-step recorder=on median_us=412.3 ratio=1.004
// (ratio: to recorder=off's in the same launch).
//
// Exits 1 if an operation fails, 2 on a bad command line.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace {

struct Config {
  int64_t iters = 200;
  int64_t rounds = 5;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "flight_recorder_bench: %s\nusage: flight_recorder_bench [--iters N] [--rounds R]\n",
               message.c_str());
  std::exit(2);
}

Config parse_args(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage_error("missing value after '" + flag + "'");
    }
    char* end = nullptr;
    const long long value = std::strtoll(argv[i + 1], &end, 10);
    if (*end != '\0' || value < 1) {
      usage_error(flag + " must be an integer >= 1 (got '" + argv[i + 1] + "')");
    }
    if (flag == "--iters") {
      config.iters = value;
    } else if (flag == "--rounds") {
      config.rounds = value;
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  return config;
}

struct Variant {
  std::string name; // "on" or "off"
  std::shared_ptr<ddp::ProcessGroup> group;
  torch::nn::Sequential net;
  std::shared_ptr<ddp::DistributedDataParallel> model;
  std::unique_ptr<torch::optim::SGD> optimizer;
  std::vector<double> allreduce_us; // per-round medians
  std::vector<double> step_us;
};

Variant make_variant(const std::string& name, std::shared_ptr<ddp::ProcessGroup> group) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(10, 10), torch::nn::ReLU(), torch::nn::Linear(10, 5));
  auto model = std::make_shared<ddp::DistributedDataParallel>(
      net, ddp::DistributedDataParallelOptions().process_group(group));
  auto optimizer = std::make_unique<torch::optim::SGD>((*model)->parameters(), torch::optim::SGDOptions(0.001));
  return Variant{name, std::move(group), net, std::move(model), std::move(optimizer), {}, {}};
}

double median_us(int64_t iters, const std::function<void()>& body) {
  std::vector<double> times;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double best(const std::vector<double>& medians) {
  return *std::min_element(medians.begin(), medians.end());
}

} // namespace

int main(int argc, char** argv) {
  const Config config = parse_args(argc, argv);
  try {
    torch::set_num_threads(1);
    auto world = ddp::init_process_group();
    std::vector<int> all;
    for (int r = 0; r < world->size(); ++r) {
      all.push_back(r);
    }
    // Every process creates both groups in the same order (new_group's rule).
    ::setenv("DDP_FLIGHT_RECORDER_SIZE", "0", 1);
    auto off_group = ddp::new_group(all);
    ::unsetenv("DDP_FLIGHT_RECORDER_SIZE");
    auto on_group = ddp::new_group(all);
    std::vector<Variant> variants;
    variants.push_back(make_variant("on", on_group));
    variants.push_back(make_variant("off", off_group));
    torch::manual_seed(1 + world->rank());
    const auto x = torch::randn({20, 10});
    const auto y = torch::randn({20, 5});
    const auto one = torch::ones({1});
    for (auto& v : variants) { // warm-up: buckets rebuilt, caches filled
      for (int i = 0; i < 10; ++i) {
        v.group->allreduce(one)->wait();
        v.optimizer->zero_grad();
        torch::mse_loss((*v.model)(x), y).backward();
        v.optimizer->step();
      }
    }
    for (int64_t round = 0; round < config.rounds; ++round) {
      for (size_t k = 0; k < variants.size(); ++k) {
        Variant& v = variants[(k + static_cast<size_t>(round)) % variants.size()];
        v.allreduce_us.push_back(median_us(config.iters, [&] { v.group->allreduce(one)->wait(); }));
        v.step_us.push_back(median_us(config.iters, [&] {
          v.optimizer->zero_grad();
          torch::mse_loss((*v.model)(x), y).backward();
          v.optimizer->step();
        }));
      }
    }
    if (world->rank() == 0) {
      for (const char* name : {"allreduce", "toy-step"}) {
        const bool step = std::string(name) == "toy-step";
        const double anchor = best(step ? variants[1].step_us : variants[1].allreduce_us);
        for (const auto& v : variants) {
          const double figure = best(step ? v.step_us : v.allreduce_us);
          std::printf("flight_recorder_bench backend=%s world=%d case=%s recorder=%s median_us=%.1f ratio=%.3f\n",
                      world->backend_name().c_str(), world->size(), name, v.name.c_str(), figure,
                      figure / anchor);
        }
      }
      std::fflush(stdout);
    }
    variants.clear();
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flight_recorder_bench: %s\n", e.what());
    return 1;
  }
}
