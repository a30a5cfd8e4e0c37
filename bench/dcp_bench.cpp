// DCP save and load: time and peak memory of ddp::dcp on one rank of a
// FullyShardedDataParallel job, beside PyTorch's torch.distributed.checkpoint
// on the same model (bench/dcp_bench.py, FSDP2); bench/run_dcp_bench.py runs
// both and prints the ratios.
//
// Usage (under ddprun):
//   ddprun --nproc-per-node 2 --no-prefix build/bench/dcp_bench --dir DIR
//       [--width 4096] [--layers 8] [--rounds 3]
// The model: Sequential of LAYERS Linear(WIDTH, WIDTH) (8 x 4096: 134M
// parameters), each a unit, kFullShard, Adam with its state made by one
// step. Each round: save to DIR, then load it back, each timed from a
// barrier to the slowest rank's end; the memory figure is the rise of this
// process's peak resident set over its resident set before the call
// (/proc/self/clear_refs resets the peak), the extra that saving or
// loading costs beyond the rank's own shard of parameters and state.
// Prints per round and rank:
//   dcp_bench impl=ddp world=2 params=... rank=R round=K save_s=... load_s=... save_extra_mb=... load_extra_mb=... shard_mb=... largest_piece_mb=...

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <ddp/ddp.h>

#include "bench_util.h"

namespace {

// VmRSS or VmHWM of this process, in MB.
double status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::stod(line.substr(std::string(field).size() + 1)) / 1024.0; // kB
    }
  }
  return -1;
}

// Resets VmHWM to the present resident set (Linux 4.0 and later).
void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

} // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t width = 4096, layers = 8, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--dir") {
      dir = value;
    } else if ((flag == "--width" && ddp_bench::parse_count(value, 1, width)) ||
               (flag == "--layers" && ddp_bench::parse_count(value, 1, layers)) ||
               (flag == "--rounds" && ddp_bench::parse_count(value, 1, rounds))) {
    } else {
      std::fprintf(stderr, "dcp_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "dcp_bench: --dir is required\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group(ddp::InitOptions().backend(ddp::Backend::kGloo));
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (int64_t l = 0; l < layers; ++l) {
      net->push_back(torch::nn::Linear(width, width));
    }
    int64_t params = 0;
    for (const auto& p : net->parameters()) {
      params += p.numel();
    }
    ddp::FullyShardedDataParallel model(net);
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-4));
    (model(torch::randn({2, width})).sum()).backward(); // Adam's state exists after a step
    adam.step();
    double shard_bytes = 0, largest = 0;
    for (const auto& p : model->parameters()) {
      shard_bytes += static_cast<double>(p.nbytes()) * 3; // the shard, exp_avg, exp_avg_sq
      largest = std::max(largest, static_cast<double>(p.nbytes())); // a unit's shard: its largest piece
    }
    for (int64_t round = 0; round < rounds; ++round) {
      auto timed = [&](auto&& body, double* extra_mb) {
        group->barrier()->wait();
        const double before = status_mb("VmRSS:");
        reset_peak();
        const auto start = std::chrono::steady_clock::now();
        body();
        const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        *extra_mb = status_mb("VmHWM:") - before;
        const auto slowest = ddp_bench::slowest_rank_sorted(*group, {mine}, torch::kCPU);
        return slowest.back();
      };
      double save_extra = 0, load_extra = 0;
      const double save_s = timed([&] { ddp::dcp::save(model, adam, dir); }, &save_extra);
      const double load_s = timed([&] { ddp::dcp::load(model, adam, dir); }, &load_extra);
      std::printf("dcp_bench impl=ddp world=%d params=%lld rank=%d round=%lld save_s=%.3f load_s=%.3f "
                  "save_extra_mb=%.1f load_extra_mb=%.1f shard_mb=%.1f largest_piece_mb=%.1f\n",
                  group->size(), static_cast<long long>(params), group->rank(), static_cast<long long>(round),
                  save_s, load_s, save_extra, load_extra, shard_bytes / 1048576.0, largest / 1048576.0);
      std::fflush(stdout);
    }
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcp_bench: %s\n", e.what());
    return 1;
  }
}
