// The MPI backend's own choices, measured against their alternatives inside
// one process, so that every alternative sees the same machine (on a busy
// machine, two separate runs differ by more than the choices do).
//
// Usage:
//   mpirun -np 2 build/bench/mpi_options_bench allreduce [--rounds N]
//   mpirun -np 2 build/bench/mpi_options_bench ddp [--iters N] [--batch N]
// prints on rank 0 one line per size or configuration, e.g.
//   mpi_options_bench what=allreduce bytes=67108864 mpi_allreduce_ms=84.30 ring_ms=44.59 shared_ms=20.10
//   mpi_options_bench what=ddp config=default median_ms=400.8 p10_ms=395.1 vs_local=1.01
//
// allreduce: two ProcessGroupMPIs over the same ranks, one with
//   ring_allreduce_min_bytes(-1) (always MPI_Allreduce) and one with 0
//   (always ddp's ring), take turns on the same float32 tensor, 4 to 64 MiB,
//   and a third with the default options on a buffer of the same size from
//   its allocate_collective_buffer (in shared memory: Note [MPI shared
//   buffers]): per round 5 timed calls each (after a barrier each), `rounds`
//   rounds (default 6); the best per-round median of each is printed.
// ddp: the MLP of ddp_step_bench (4 x Linear(2500, 2500), batch 8, SGD) is
//   trained under seven configurations in turn, one step each per
//   iteration: no DistributedDataParallel at all ("local"), then DDP over a
//   ProcessGroupMPI with the default options (buckets in shared memory),
//   with the buckets in private memory (shared_memory_min_bytes(-1):
//   "no_shared", then the ring reduces them), without the arrival wait
//   (arrival_wait_min_bytes(-1)), with private buckets and without the ring
//   (MPI_Allreduce: "no_shared_no_ring"), and DDP's gradient_as_bucket_view
//   with shared and with private buckets ("grad_view",
//   "grad_view_no_shared"). Each step starts after a barrier and its
//   time is the slowest rank's; 3 warm-up iterations, then `iters` (default
//   12); the median and 10th percentile per configuration are printed, with
//   the ratio to "local".
// One intra-op thread per rank, as the other benchmarks.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace {

using Clock = std::chrono::steady_clock;

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5)];
}

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr,
               "mpi_options_bench: %s\n"
               "usage: mpi_options_bench allreduce [--rounds N] | ddp [--iters N] [--batch N]\n",
               message.c_str());
  std::exit(2);
}

void allreduce(int rounds) {
  auto builtin = ddp::ProcessGroupMPI::create(ddp::ProcessGroupMPIOptions().ring_allreduce_min_bytes(-1));
  auto ring = ddp::ProcessGroupMPI::create(ddp::ProcessGroupMPIOptions().ring_allreduce_min_bytes(0));
  auto shared = ddp::ProcessGroupMPI::create();
  for (int64_t mib : {4, 8, 16, 32, 64}) {
    auto tensor = torch::zeros({mib << 18});
    auto buffer = shared->allocate_collective_buffer(mib << 18, torch::kFloat);
    double best[3] = {1e30, 1e30, 1e30};
    for (int round = 0; round < rounds; ++round) {
      for (int which = 0; which < 3; ++which) {
        auto& pg = which == 0 ? *builtin : which == 1 ? *ring : *shared;
        auto& tensor_of_pg = which == 2 ? buffer : tensor;
        pg.allreduce(tensor_of_pg)->wait();
        std::vector<double> ms;
        for (int i = 0; i < 5; ++i) {
          pg.barrier()->wait();
          const auto start = Clock::now();
          pg.allreduce(tensor_of_pg)->wait();
          ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        }
        best[which] = std::min(best[which], quantile(ms, 0.5));
      }
    }
    if (builtin->rank() == 0) {
      std::printf(
          "mpi_options_bench what=allreduce bytes=%lld mpi_allreduce_ms=%.2f ring_ms=%.2f shared_ms=%.2f%s\n",
          static_cast<long long>(mib << 20), best[0], best[1], best[2],
          shared->is_shared_buffer(buffer) ? "" : " (the buffer is NOT in shared memory)");
    }
  }
}

torch::nn::Sequential make_mlp() {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int layer = 0; layer < 4; ++layer) {
    if (layer > 0) {
      net->push_back(torch::nn::ReLU());
    }
    net->push_back(torch::nn::Linear(2500, 2500));
  }
  return net;
}

void ddp_step(int iters, int batch) {
  struct Config {
    const char* name;
    std::shared_ptr<ddp::ProcessGroup> group; // null: no DDP
    torch::nn::Sequential net;
    std::optional<ddp::DistributedDataParallel> model;
    std::unique_ptr<torch::optim::SGD> optimizer;
    std::vector<double> ms;
  };
  const auto private_buckets = ddp::ProcessGroupMPIOptions().shared_memory_min_bytes(-1);
  std::vector<Config> configs(7);
  configs[0].name = "local";
  configs[1].name = "default";
  configs[1].group = ddp::ProcessGroupMPI::create();
  configs[2].name = "no_shared";
  configs[2].group = ddp::ProcessGroupMPI::create(private_buckets);
  configs[3].name = "no_arrival_wait";
  configs[3].group = ddp::ProcessGroupMPI::create(ddp::ProcessGroupMPIOptions().arrival_wait_min_bytes(-1));
  configs[4].name = "no_shared_no_ring";
  configs[4].group =
      ddp::ProcessGroupMPI::create(ddp::ProcessGroupMPIOptions(private_buckets).ring_allreduce_min_bytes(-1));
  configs[5].name = "grad_view";
  configs[5].group = ddp::ProcessGroupMPI::create();
  configs[6].name = "grad_view_no_shared";
  configs[6].group = ddp::ProcessGroupMPI::create(private_buckets);
  auto& world = *configs[1].group;
  for (auto& config : configs) {
    config.net = make_mlp();
    if (config.group) {
      const bool as_view = std::string(config.name).rfind("grad_view", 0) == 0;
      config.model.emplace(config.net, ddp::DistributedDataParallelOptions()
                                           .process_group(config.group)
                                           .gradient_as_bucket_view(as_view));
    }
    config.optimizer = std::make_unique<torch::optim::SGD>(config.net->parameters(), 0.001);
  }
  torch::manual_seed(world.rank() + 1);
  const auto x = torch::randn({batch, 2500});
  const auto y = torch::randn({batch, 2500});
  for (int i = 0; i < iters + 3; ++i) {
    for (auto& config : configs) {
      world.barrier()->wait();
      const auto start = Clock::now();
      config.optimizer->zero_grad();
      const auto output = config.model ? (*config.model)(x) : config.net->forward(x);
      torch::mse_loss(output, y).backward();
      config.optimizer->step();
      auto ms = torch::full({1}, std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
                            torch::kDouble);
      world.allreduce(ms, {ddp::ReduceOp::kMax})->wait();
      if (i >= 3) {
        config.ms.push_back(ms.item<double>());
      }
    }
  }
  if (world.rank() == 0) {
    const double local = quantile(configs[0].ms, 0.5);
    for (const auto& config : configs) {
      std::printf("mpi_options_bench what=ddp blas=%s config=%s batch=%d iters=%d median_ms=%.1f "
                  "p10_ms=%.1f vs_local=%.2f\n",
                  ddp::blas_in_use().token().c_str(), config.name, batch, iters, quantile(config.ms, 0.5), quantile(config.ms, 0.1),
                  quantile(config.ms, 0.5) / local);
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage("missing allreduce or ddp");
  }
  const std::string what = argv[1];
  int rounds = 6;
  int iters = 12;
  int batch = 8;
  if (argc % 2 != 0) {
    usage("every flag needs a value");
  }
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (value < 1) {
      usage(flag + " must be a positive integer");
    }
    if (flag == "--rounds") {
      rounds = value;
    } else if (flag == "--iters") {
      iters = value;
    } else if (flag == "--batch") {
      batch = value;
    } else {
      usage("unknown flag '" + flag + "'");
    }
  }
  try {
    at::set_num_threads(1);
    if (what == "allreduce") {
      allreduce(rounds);
    } else if (what == "ddp") {
      ddp_step(iters, batch);
    } else {
      usage("unknown benchmark '" + what + "'");
    }
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "mpi_options_bench: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_options_bench: %s\n", e.what());
  }
  return 1;
}
