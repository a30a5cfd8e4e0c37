// Allreduce latency and bus bandwidth of ddp's backends (Gloo, MPI): the C++
// half of a side-by-side benchmark. bench/allreduce_bench.py is the
// torch.distributed half, written to the same methodology line for line, and
// bench/run_allreduce_bench.py runs ddp-MPI, ddp-Gloo and torch-Gloo and
// compares them (see docs/benchmarks.md).
//
// Usage:
//   build/ddprun --nproc-per-node 2 --no-prefix build/bench/allreduce_bench
//       [--sizes 4096,1M,64M] [--iters N] [--warmup N]
//   DDP_BACKEND=mpi mpirun -np 2 build/bench/allreduce_bench [...]
//   [--layout contiguous|column|both|shared]
// prints on rank 0, for each size (bytes of float32; a K or M suffix means
// KiB or MiB; default 4 KiB to 64 MiB in steps of 4x), one line
//   allreduce_bench impl=ddp backend=gloo world=2 dtype=float32 bytes=4096 warmup=100 iters=1000 median_us=61.20 p10_us=55.31 p90_us=70.02 busbw_gbps=0.0669
// and exits 0. With --layout column the tensor is a column of a
// [bytes / 4, 2] matrix (strided: each call copies it to contiguous memory
// and back, Note [Non-contiguous arguments]), and the line says
// layout=column; --layout both measures each size both ways and adds
//   allreduce_bench layout_ratio backend=gloo world=2 bytes=4096 column_over_contiguous=1.08
// with the contiguous tensor, the unchanged path, as the anchor. With
// --layout shared the tensor comes from allocate_collective_buffer (memory
// that the ranks of the host map, when the backend offers it: Note [Shared
// buffers]), measured beside the private contiguous tensor and beside the
// floor, one rank copying the same bytes with memcpy while the other ranks
// do the same (each byte of the shared allreduce is read and written about
// once per rank, as a copy's are):
//   allreduce_bench layout=shared ... (as above)
//   allreduce_bench memcpy world=2 bytes=... median_us=... gbps=...
//   allreduce_bench shared_ratio backend=gloo world=2 bytes=... shared_over_private=0.21 shared_over_memcpy=1.9
// It exits 1 if a collective fails or gives a wrong sum, and 2 on a bad
// command line.
//
// How it measures, per size:
//   1. Fill the tensor with rank + 1, allreduce once and check the sum, then
//      fill it with zeros: repeated in-place sums of zeros stay finite and
//      never denormal, so every iteration does the same arithmetic.
//   2. `warmup` untimed allreduces, back to back.
//   3. `iters` timed allreduces. Each starts right after a barrier, so that
//      the ranks start together and no iteration overlaps the previous one,
//      and is timed alone, from the call to the end of `wait()`.
//   4. The per-iteration times are allreduced with MAX (a collective ends
//      when its slowest rank does), and rank 0 reports their median, 10th
//      and 90th percentiles, and the bus bandwidth of the median:
//      busbw = 2(n-1)/n x bytes / median, the bytes each rank's link carries
//      in a ring allreduce, so that the figure is comparable across world
//      sizes (NCCL's nccl-tests convention).
// The iteration count falls with the size (kTimedBytesPerSize) so that the
// sweep stays short; --iters and --warmup override it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;

// The default sizes: 4 KiB to 64 MiB in steps of 4x.
const std::vector<int64_t> kDefaultSizes = {4 * kKiB,  16 * kKiB, 64 * kKiB, 256 * kKiB,
                                            1 * kMiB,  4 * kMiB,  16 * kMiB, 64 * kMiB};

// Bytes allreduced in the timed loop of one size, which sets its iteration
// count, kept within [kMinIters, kMaxIters]. The same constants are in
// allreduce_bench.py.
constexpr int64_t kTimedBytesPerSize = 256 * kMiB;
constexpr int64_t kMinIters = 20;
constexpr int64_t kMaxIters = 1000;
constexpr int64_t kMinWarmup = 5;

struct Config {
  std::vector<int64_t> sizes_bytes = kDefaultSizes;
  int64_t iters = 0;  // 0: from the size (iters_for)
  int64_t warmup = -1; // -1: from the iteration count (warmup_for)
  bool contiguous = true;
  bool column = false;
  bool shared = false;
};

int64_t iters_for(int64_t bytes) {
  return std::clamp(kTimedBytesPerSize / bytes, kMinIters, kMaxIters);
}

int64_t warmup_for(int64_t iters) {
  return std::max(kMinWarmup, iters / 10);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "allreduce_bench: %s\n"
               "usage: allreduce_bench [--sizes BYTES[,BYTES...]] [--iters N] [--warmup N]\n"
               "                       [--layout contiguous|column|both|shared]\n"
               "BYTES may end in K (KiB) or M (MiB) and must be a positive multiple of 4.\n",
               message.c_str());
  std::exit(2);
}

// Parses a non-negative integer with an optional K or M suffix; -1 if malformed.
int64_t parse_count(const std::string& text, bool allow_suffix) {
  if (text.empty()) {
    return -1;
  }
  int64_t scale = 1;
  std::string digits = text;
  if (allow_suffix && (digits.back() == 'K' || digits.back() == 'M')) {
    scale = digits.back() == 'K' ? kKiB : kMiB;
    digits.pop_back();
  }
  if (digits.empty() || digits.size() > 12 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits) * scale;
}

Config parse_args(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage_error("missing value after '" + flag + "'");
    }
    const std::string value = argv[++i];
    if (flag == "--sizes") {
      config.sizes_bytes.clear();
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        const std::string item = value.substr(start, comma - start);
        const int64_t bytes = parse_count(item, /*allow_suffix=*/true);
        if (bytes <= 0 || bytes % 4 != 0) {
          usage_error("--sizes: each size must be a positive multiple of 4 bytes (got '" + item +
                      "')");
        }
        config.sizes_bytes.push_back(bytes);
        start = comma + 1;
      }
    } else if (flag == "--iters") {
      config.iters = parse_count(value, /*allow_suffix=*/false);
      if (config.iters <= 0) {
        usage_error("--iters must be an integer >= 1 (got '" + value + "')");
      }
    } else if (flag == "--warmup") {
      config.warmup = parse_count(value, /*allow_suffix=*/false);
      if (config.warmup < 0) {
        usage_error("--warmup must be an integer >= 0 (got '" + value + "')");
      }
    } else if (flag == "--layout") {
      if (value != "contiguous" && value != "column" && value != "both" && value != "shared") {
        usage_error("--layout must be contiguous, column, both or shared (got '" + value + "')");
      }
      config.contiguous = value != "column";
      config.column = value == "column" || value == "both";
      config.shared = value == "shared";
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  return config;
}

// The value at quantile q of `sorted`: the nearest rank, rounding halves up.
double quantile(const std::vector<double>& sorted, double q) {
  const auto index = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(index, sorted.size() - 1)];
}

// Runs one size; returns the median in seconds, or a negative number if the
// check sum is wrong.
double run_size(ddp::ProcessGroup& pg, int64_t bytes, int64_t iters, int64_t warmup, bool column,
                bool shared = false) {
  using Clock = std::chrono::steady_clock;
  const int world = pg.size();
  auto tensor = shared   ? pg.allocate_collective_buffer(bytes / 4, at::kFloat)
                : column ? at::empty({bytes / 4, 2}, at::kFloat).select(1, 1)
                         : at::empty({bytes / 4}, at::kFloat);

  tensor.fill_(pg.rank() + 1.0);
  pg.allreduce(tensor)->wait();
  const double expected = world * (world + 1) / 2.0;
  if (!at::all(tensor == expected).item<bool>()) {
    std::fprintf(stderr, "allreduce_bench: [rank %d/%d] allreduce of %lld bytes gave a wrong sum "
                 "(expected %g everywhere, got min %g max %g)\n",
                 pg.rank(), world, static_cast<long long>(bytes), expected,
                 tensor.min().item<double>(), tensor.max().item<double>());
    return -1;
  }
  tensor.zero_();

  for (int64_t i = 0; i < warmup; ++i) {
    pg.allreduce(tensor)->wait();
  }

  auto seconds = at::empty({iters}, at::kDouble);
  auto* seconds_data = seconds.data_ptr<double>();
  for (int64_t i = 0; i < iters; ++i) {
    pg.barrier()->wait();
    const auto start = Clock::now();
    pg.allreduce(tensor)->wait();
    seconds_data[i] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  pg.allreduce(seconds, {ddp::ReduceOp::kMax})->wait();

  std::vector<double> sorted(seconds_data, seconds_data + iters);
  std::sort(sorted.begin(), sorted.end());
  const double median = quantile(sorted, 0.5);
  if (pg.rank() == 0) {
    const double busbw = 2.0 * (world - 1) / world * static_cast<double>(bytes) / median;
    std::printf("allreduce_bench impl=ddp backend=%s world=%d dtype=float32 bytes=%lld%s "
                "warmup=%lld iters=%lld median_us=%.2f p10_us=%.2f p90_us=%.2f busbw_gbps=%.4f\n",
                pg.backend_name().c_str(), world, static_cast<long long>(bytes),
                column ? " layout=column" : shared ? " layout=shared" : "", static_cast<long long>(warmup),
                static_cast<long long>(iters), median * 1e6, quantile(sorted, 0.1) * 1e6,
                quantile(sorted, 0.9) * 1e6, busbw / 1e9);
    std::fflush(stdout);
  }
  return median;
}

// The floor of a shared-memory allreduce: every rank copies `bytes` with
// memcpy at once (the ranks share the memory bus, as they do in the
// allreduce); returns rank 0's median seconds, maxed over the ranks.
double memcpy_floor(ddp::ProcessGroup& pg, int64_t bytes, int64_t iters) {
  using Clock = std::chrono::steady_clock;
  std::vector<char> from(static_cast<size_t>(bytes), 1);
  std::vector<char> to(static_cast<size_t>(bytes), 0);
  auto seconds = at::empty({iters}, at::kDouble);
  auto* data = seconds.data_ptr<double>();
  for (int64_t i = 0; i < iters; ++i) {
    pg.barrier()->wait();
    const auto start = Clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    data[i] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  pg.allreduce(seconds, {ddp::ReduceOp::kMax})->wait();
  std::vector<double> sorted(data, data + iters);
  std::sort(sorted.begin(), sorted.end());
  const double median = quantile(sorted, 0.5);
  if (pg.rank() == 0) {
    std::printf("allreduce_bench memcpy world=%d bytes=%lld iters=%lld median_us=%.2f gbps=%.4f\n", pg.size(),
                static_cast<long long>(bytes), static_cast<long long>(iters), median * 1e6,
                static_cast<double>(bytes) / median / 1e9);
    std::fflush(stdout);
  }
  return median;
}

} // namespace

int main(int argc, char** argv) {
  const Config config = parse_args(argc, argv);
  try {
    // One intra-op thread, as the Python half: two ranks share two cores.
    at::set_num_threads(1);
    auto pg = ddp::init_process_group();
    bool ok = true;
    for (const int64_t bytes : config.sizes_bytes) {
      const int64_t iters = config.iters > 0 ? config.iters : iters_for(bytes);
      const int64_t warmup = config.warmup >= 0 ? config.warmup : warmup_for(iters);
      const double contiguous = config.contiguous ? run_size(*pg, bytes, iters, warmup, false) : 0;
      const double column = config.column ? run_size(*pg, bytes, iters, warmup, true) : 0;
      const double shared = config.shared ? run_size(*pg, bytes, iters, warmup, false, true) : 0;
      if (contiguous < 0 || column < 0 || shared < 0) {
        ok = false;
        break;
      }
      if (config.shared) {
        const double floor = memcpy_floor(*pg, bytes, iters);
        if (pg->rank() == 0) {
          std::printf("allreduce_bench shared_ratio backend=%s world=%d bytes=%lld "
                      "shared_over_private=%.2f shared_over_memcpy=%.2f\n",
                      pg->backend_name().c_str(), pg->size(), static_cast<long long>(bytes),
                      shared / contiguous, shared / floor);
          std::fflush(stdout);
        }
      }
      if (config.contiguous && config.column && pg->rank() == 0) {
        std::printf("allreduce_bench layout_ratio backend=%s world=%d bytes=%lld "
                    "column_over_contiguous=%.2f\n",
                    pg->backend_name().c_str(), pg->size(), static_cast<long long>(bytes),
                    column / contiguous);
        std::fflush(stdout);
      }
    }
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
