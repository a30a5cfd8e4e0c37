// The soak: many training steps with the flight recorder and the timeline on,
// watching for what a long run would lose to a leak (docs/reliability.md,
// "Long runs"). Each rank samples, every --sample-every steps, its resident
// set, its open file descriptors, its threads and the bytes of /dev/shm it
// has mapped, with the time of the steps since the last sample.
//
// Usage (the timeline is on when DDP_TRACE_DIR is set: ddprun --trace DIR):
//   build/ddprun --nproc-per-node 2 --no-prefix --trace DIR build/bench/soak
//       --variant ddp|zero2|fsdp [--minutes M | --steps N] [--sample-every K]
//       [--width W] [--layers L] [--batch B] [--flush-denormal 1|0]
//       [--leak-bytes-per-step N]
//   DDP_BACKEND=mpi mpirun -np 2 build/bench/soak --variant ddp [...]
//
// The model: L x Linear(W, W) (default 4 x 256), ReLU between, batch 32,
// Adam; ddp: DDP; zero2: DDP with ZeroRedundancyOptimizer stage 2; fsdp:
// FSDP FULL_SHARD, each Linear a unit. --minutes (default 20) runs until
// then; --steps runs exactly N steps instead.
//
// How growth is decided. The first 20% of the samples are warm-up (the
// allocator's pools, the flight recorder's ring and the timeline's window
// filling) and left out. Over the rest: descriptors, threads and /dev/shm
// bytes must not grow: the last tenth of the samples may hold no more than
// the most the first tenth held (they are counts, with no noise; they may
// fall, as when the store server closes idle connections). Memory is
// judged by what the process holds: its resident set less the free bytes
// that malloc keeps in its arenas for reuse (mallinfo2). glibc keeps freed
// blocks resident and now and then takes a few MB more from the system when
// a large block does not fit its free list, then gives them back later, so
// the resident set alone moves by 3-4 MB with nothing leaked (samples of
// soak_short_ddp under load, 2026-11-28: the resident set and malloc's
// free bytes rose and fell together, to the kilobyte). A leak is memory held
// and never freed, so it grows this measure as it grows the resident set.
// Its least-squares slope, times the span of the run after warm-up, must
// stay within 3 times the residuals' standard deviation or kHeldBoundKb
// (2 MiB), whichever is larger. The resident set's own slope is printed
// too. The step time of the last 10% of the samples against the first 10%
// after warm-up: the ratio, printed.
//
// Subnormal numbers. The model trains on one fixed batch, and Adam's
// moving averages of weights whose gradient has become zero or tiny (units
// that ReLU has shut) decay a little every step, through float32's
// subnormal range (below 1.2e-38) on their way to zero; CPU arithmetic on
// subnormals is tens of times slower. The soak therefore flushes them to
// zero (at::globalContext().setFlushDenormal; --flush-denormal 0 keeps
// them, as LibTorch does by default) and prints how many Adam's state
// holds at the end: docs/reliability.md has the runs that found it.
//
// Each rank prints, at the end:
//   soak variant=ddp backend=gloo world=2 rank=R steps=N samples=S
//   rss_mb_first=... rss_mb_last=... rss_slope_kb_per_1k_steps=...
//   rss_noise_kb=... held_slope_kb_per_1k_steps=... held_noise_kb=...
//   fds=A..B threads=A..B shm_kb=A..B
//   step_ms_first=... step_ms_last=... step_ratio=... flush_denormal=1|0 subnormal=N
//   step_ms_tenths=T1,...,T10 growth=none|rss|fds|threads|shm,...
// (step_ms_tenths: the mean step time in each tenth of the run, warm-up
// included.)
// (A..B: the least and most seen after warm-up; held: the resident set less
// malloc's free bytes.) When something grew, a second line lists the
// samples after warm-up. --leak-bytes-per-step N leaks N resident bytes a
// step, for a check that the soak finds a leak. Exits 0 whatever it finds
// (a benchmark), 1 if a step fails, 2 on a bad command line.

#include <torch/torch.h>

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string variant = "ddp";
  double minutes = 20;
  int64_t steps = 0; // 0: run for `minutes`
  int64_t sample_every = 100;
  int64_t width = 256;
  int64_t layers = 4;
  int64_t batch = 32;
  bool flush_denormal = true;
  int64_t leak_bytes = 0; // --leak-bytes-per-step: the soak's own check of itself
};

struct Sample {
  int64_t step = 0;
  double rss_kb = 0;
  double malloc_free_kb = 0; // free bytes malloc keeps for reuse (mallinfo2's fordblks)
  int64_t fds = 0;
  int64_t threads = 0;
  int64_t shm_kb = 0;
  double step_ms = 0; // mean over the steps since the last sample
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr,
               "soak: %s\nusage: soak --variant ddp|zero2|fsdp [--minutes M | --steps N] "
               "[--sample-every K] [--width W] [--layers L] [--batch B] [--flush-denormal 1|0]\n"
               "            [--leak-bytes-per-step N]\n",
               why.c_str());
  std::exit(2);
}

Config parse(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage_error(flag + " needs a value");
    }
    const std::string value = argv[++i];
    int64_t number = 0;
    if (flag == "--variant") {
      if (value != "ddp" && value != "zero2" && value != "fsdp") {
        usage_error("--variant is ddp, zero2 or fsdp (got '" + value + "')");
      }
      config.variant = value;
    } else if (flag == "--flush-denormal") {
      if (value != "0" && value != "1") {
        usage_error("--flush-denormal is 1 or 0 (got '" + value + "')");
      }
      config.flush_denormal = value == "1";
    } else if (flag == "--minutes") {
      char* end = nullptr;
      config.minutes = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(config.minutes > 0)) {
        usage_error("--minutes takes a positive number (got '" + value + "')");
      }
    } else if (!ddp_bench::parse_count(value, 1, number)) {
      usage_error(flag + " takes a whole number >= 1 (got '" + value + "')");
    } else if (flag == "--steps") {
      config.steps = number;
    } else if (flag == "--sample-every") {
      config.sample_every = number;
    } else if (flag == "--width") {
      config.width = number;
    } else if (flag == "--layers") {
      config.layers = number;
    } else if (flag == "--batch") {
      config.batch = number;
    } else if (flag == "--leak-bytes-per-step") {
      config.leak_bytes = number;
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  return config;
}

double resident_kb() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0;
  int64_t resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1024.0;
}

// Free bytes inside malloc's arenas, all arenas together: memory the
// process keeps resident but holds nothing in (see "How growth is decided").
double malloc_free_kb() {
  const struct mallinfo2 info = ::mallinfo2();
  return static_cast<double>(info.fordblks) / 1024.0;
}

int64_t open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) {
    return -1;
  }
  int64_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') {
      ++count;
    }
  }
  ::closedir(dir);
  return count - 1; // the directory's own descriptor
}

int64_t thread_count() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) {
      return std::atoll(line.c_str() + 8);
    }
  }
  return -1;
}

// The bytes of /dev/shm this process has mapped (its shared buffers, whose
// names are unlinked once mapped): /dev/shm's own usage would count every
// other job on the machine.
int64_t shm_mapped_kb() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int64_t bytes = 0;
  while (std::getline(maps, line)) {
    if (line.find(" /dev/shm/") == std::string::npos) {
      continue;
    }
    unsigned long long start = 0;
    unsigned long long end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &start, &end) == 2) {
      bytes += static_cast<int64_t>(end - start);
    }
  }
  return bytes / 1024;
}

// A model, its forward and its optimizer, for `variant`.
struct Trainer {
  torch::nn::Sequential net;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  torch::optim::Optimizer* adam = nullptr; // the one holding Adam's state (ZeRO's local one)
  std::shared_ptr<void> keep;              // the wrapper
};

Trainer make_trainer(const Config& config) {
  torch::manual_seed(0);
  Trainer t{ddp_bench::make_mlp(config.width, config.layers), nullptr, nullptr, nullptr, nullptr};
  const auto adam = torch::optim::AdamOptions(1e-3);
  if (config.variant == "fsdp") {
    auto options = ddp::FullyShardedDataParallelOptions()
                       .sharding_strategy(ddp::ShardingStrategy::kFullShard)
                       .auto_wrap_policy(ddp::module_wrap_policy<torch::nn::LinearImpl>());
    auto model = std::make_shared<ddp::FullyShardedDataParallel>(t.net, options);
    t.forward = [model](const torch::Tensor& x) { return (*model)(x); };
    t.optimizer = std::make_unique<torch::optim::Adam>((*model)->parameters(), adam);
    t.adam = t.optimizer.get();
    t.keep = model;
    return t;
  }
  auto model = std::make_shared<ddp::DistributedDataParallel>(t.net);
  t.forward = [model](const torch::Tensor& x) { return (*model)(x); };
  if (config.variant == "zero2") {
    auto zero = std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam>>(
        (*model)->parameters(), adam, ddp::optim::ZeroRedundancyOptimizerOptions().stage(2));
    zero->overlap_with(*model);
    t.adam = &zero->local_optimizer();
    t.optimizer = std::move(zero);
  } else {
    t.optimizer = std::make_unique<torch::optim::Adam>((*model)->parameters(), adam);
    t.adam = t.optimizer.get();
  }
  t.keep = model;
  return t;
}

// Least-squares slope of y over x, and the residuals' standard deviation.
void fit(const std::vector<double>& x, const std::vector<double>& y, double& slope, double& noise) {
  const double n = static_cast<double>(x.size());
  double mx = 0;
  double my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i] / n;
    my += y[i] / n;
  }
  double sxy = 0;
  double sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  slope = sxx > 0 ? sxy / sxx : 0;
  double ss = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = y[i] - (my + slope * (x[i] - mx));
    ss += r * r;
  }
  noise = x.size() > 2 ? std::sqrt(ss / (n - 2)) : 0;
}

double mean_step_ms(const std::vector<Sample>& samples, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) {
    sum += samples[i].step_ms;
  }
  return to > from ? sum / static_cast<double>(to - from) : 0;
}

// The subnormal floats in Adam's state (its moving averages), on which a
// CPU computes tens of times slower: see "Subnormal numbers" above.
int64_t subnormal_count(torch::optim::Optimizer& optimizer) {
  int64_t count = 0;
  const auto add = [&](const torch::Tensor& t) {
    if (t.defined() && t.scalar_type() == torch::kFloat) {
      // By their bits: a zero exponent and a mantissa that is not. (With
      // subnormals flushed, this thread's arithmetic would read them as 0.)
      const auto bits = t.contiguous().view(torch::kInt);
      count += (bits.bitwise_and(0x7f800000).eq(0) & bits.bitwise_and(0x007fffff).ne(0)).sum().item<int64_t>();
    }
  };
  for (const auto& item : optimizer.state()) {
    if (const auto* state = dynamic_cast<const torch::optim::AdamParamState*>(item.second.get())) {
      add(state->exp_avg());
      add(state->exp_avg_sq());
    }
  }
  return count;
}

// The bound on what the process holds (see "How growth is decided"): the
// short runs of CTest drift by under 0.4 MB (2026-11-28, 24 runs of the
// three variants side by side).
constexpr double kHeldBoundKb = 2048;

void report(const Config& config, const std::string& backend, int rank, int world, int64_t steps,
            const std::vector<Sample>& samples, int64_t subnormal) {
  const size_t warm = samples.size() / 5;
  std::vector<Sample> kept(samples.begin() + static_cast<std::ptrdiff_t>(warm), samples.end());
  if (kept.size() < 3) {
    std::printf("soak variant=%s backend=%s world=%d rank=%d steps=%lld samples=%zu too_few_samples\n",
                config.variant.c_str(), backend.c_str(), world, rank, static_cast<long long>(steps),
                samples.size());
    return;
  }
  std::vector<double> x;
  std::vector<double> rss;
  std::vector<double> held;
  for (const auto& s : kept) {
    x.push_back(static_cast<double>(s.step));
    rss.push_back(s.rss_kb);
    held.push_back(s.rss_kb - s.malloc_free_kb);
  }
  double slope = 0;
  double noise = 0;
  fit(x, rss, slope, noise);
  double held_slope = 0;
  double held_noise = 0;
  fit(x, held, held_slope, held_noise);
  const double span = x.back() - x.front();
  const auto range = [&](int64_t Sample::*field) {
    int64_t lo = kept.front().*field;
    int64_t hi = lo;
    for (const auto& s : kept) {
      lo = std::min(lo, s.*field);
      hi = std::max(hi, s.*field);
    }
    return std::make_pair(lo, hi);
  };
  const auto fds = range(&Sample::fds);
  const auto threads = range(&Sample::threads);
  const auto shm = range(&Sample::shm_kb);
  std::string growth;
  const auto add = [&](const char* what) { growth += (growth.empty() ? "" : ",") + std::string(what); };
  if (held_slope * span > std::max(3 * held_noise, kHeldBoundKb)) {
    add("rss");
  }
  // Counts have no noise, but they may fall: the store server closes
  // connections that stayed silent for its idle timeout (10 minutes), so
  // rank 0's descriptors drop by two in a long run. Growth is what the last
  // tenth of the samples holds beyond the first tenth's most.
  const size_t tenth = std::max<size_t>(1, kept.size() / 10);
  const auto grew = [&](int64_t Sample::*field) {
    int64_t start = 0;
    int64_t end = 0;
    for (size_t i = 0; i < tenth; ++i) {
      start = std::max(start, kept[i].*field);
      end = std::max(end, kept[kept.size() - 1 - i].*field);
    }
    return end > start;
  };
  if (grew(&Sample::fds)) {
    add("fds");
  }
  if (grew(&Sample::threads)) {
    add("threads");
  }
  if (grew(&Sample::shm_kb)) {
    add("shm");
  }
  const double first_ms = mean_step_ms(kept, 0, tenth);
  const double last_ms = mean_step_ms(kept, kept.size() - tenth, kept.size());
  // The step time through the whole run (warm-up included), a tenth at a
  // time: a drift and a slow patch look different here.
  std::string tenths;
  for (size_t part = 0; part < 10; ++part) {
    const size_t from = samples.size() * part / 10;
    const size_t to = std::max(from + 1, samples.size() * (part + 1) / 10);
    char value[32];
    std::snprintf(value, sizeof(value), "%s%.3f", part == 0 ? "" : ",", mean_step_ms(samples, from, to));
    tenths += value;
  }
  std::printf(
      "soak variant=%s backend=%s world=%d rank=%d steps=%lld samples=%zu rss_mb_first=%.1f "
      "rss_mb_last=%.1f rss_slope_kb_per_1k_steps=%.2f rss_noise_kb=%.1f held_slope_kb_per_1k_steps=%.2f "
      "held_noise_kb=%.1f fds=%lld..%lld "
      "threads=%lld..%lld shm_kb=%lld..%lld step_ms_first=%.3f step_ms_last=%.3f step_ratio=%.3f "
      "flush_denormal=%d subnormal=%lld step_ms_tenths=%s growth=%s\n",
      config.variant.c_str(), backend.c_str(), world, rank, static_cast<long long>(steps), samples.size(),
      kept.front().rss_kb / 1024, kept.back().rss_kb / 1024, slope * 1000, noise, held_slope * 1000, held_noise,
      static_cast<long long>(fds.first), static_cast<long long>(fds.second),
      static_cast<long long>(threads.first), static_cast<long long>(threads.second),
      static_cast<long long>(shm.first), static_cast<long long>(shm.second), first_ms, last_ms,
      first_ms > 0 ? last_ms / first_ms : 0, config.flush_denormal ? 1 : 0, static_cast<long long>(subnormal),
      tenths.c_str(), growth.empty() ? "none" : growth.c_str());
  if (!growth.empty()) {
    // What grew, sample by sample after warm-up: the resident set and the
    // free bytes malloc kept.
    std::string series;
    for (const auto& sample : kept) {
      series += c10::str(series.empty() ? "" : " ", static_cast<int64_t>(sample.rss_kb), "/",
                         static_cast<int64_t>(sample.malloc_free_kb), "/", sample.fds, "/", sample.threads, "/",
                         sample.shm_kb);
    }
    std::printf("soak rank=%d samples rss_kb/malloc_free_kb/fds/threads/shm_kb: %s\n", rank, series.c_str());
  }
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  const Config config = parse(argc, argv);
  try {
    torch::set_num_threads(1);
    // See "Subnormal numbers" above; LibTorch's default is off.
    at::globalContext().setFlushDenormal(config.flush_denormal);
    auto group = ddp::init_process_group();
    const int rank = group->rank();
    const int world = group->size();
    Trainer trainer = make_trainer(config);
    torch::manual_seed(1 + rank);
    const auto x = torch::randn({config.batch, config.width});
    const auto y = torch::randn({config.batch, config.width});
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(config.minutes * 60));
    std::vector<Sample> samples;
    int64_t step = 0;
    auto window_start = Clock::now();
    auto stop = torch::zeros({1});
    for (;;) {
      trainer.optimizer->zero_grad();
      torch::mse_loss(trainer.forward(x), y).backward();
      trainer.optimizer->step();
      ++step;
      if (config.leak_bytes > 0) {
        // A leak on purpose, written so that its pages are resident: the
        // soak must then print growth=rss (CTest's soak_finds_a_leak).
        std::memset(std::malloc(static_cast<size_t>(config.leak_bytes)), 1, static_cast<size_t>(config.leak_bytes));
      }
      if (step % config.sample_every != 0) {
        continue;
      }
      const auto now = Clock::now();
      Sample s;
      s.step = step;
      s.rss_kb = resident_kb();
      s.malloc_free_kb = malloc_free_kb();
      s.fds = open_fds();
      s.threads = thread_count();
      s.shm_kb = shm_mapped_kb();
      s.step_ms = std::chrono::duration<double, std::milli>(now - window_start).count() /
          static_cast<double>(config.sample_every);
      samples.push_back(s);
      // Every rank stops at the same step: rank 0's clock decides.
      bool done = config.steps > 0 ? step >= config.steps : false;
      if (config.steps == 0) {
        stop.fill_(rank == 0 && now >= deadline ? 1 : 0);
        group->broadcast(stop)->wait(); // from rank 0
        done = stop.item<float>() > 0;
      }
      window_start = Clock::now();
      if (done) {
        break;
      }
    }
    report(config, group->backend_name(), rank, world, step, samples, subnormal_count(*trainer.adam));
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
