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
// On a small shared machine those two figures move by more than the
// recorder's cost from launch to launch, so rank 0 also measures the added
// work itself: one collective's record (queued, started, completed, on a
// recorder of its own) and one timeline event (Note [Timeline], on a
// timeline of its own), each the mean of a million, and counts what a
// ToyModel step records (its collectives, from the recording group's record
// numbers; its timeline events, at most 3 + 2 per bucket + 2 per collective),
// and what an MLP step records.
// Against the step's time in the same launch:
//   flight_recorder_bench ... case=direct-cost model=toy step_us=412.3 record_us=0.31 collectives_per_step=1
//     recorder_ratio=1.0008 event_us=0.25 events_per_step=7 timeline_ratio=1.0042
// and the same for bench/ddp_step_bench's 25M-parameter MLP (model=mlp; its
// step the median of 3).
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

#include "comm/fingerprint.h"
#include "flight_recorder/flight_recorder.h"
#include "timeline/timeline.h"

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

using DdpModel = ddp::DistributedDataParallel;

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

constexpr int64_t kDirectRepeats = 1000000;

// Mean microseconds of `body` over kDirectRepeats calls.
double mean_us(const std::function<void(int64_t)>& body) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kDirectRepeats; ++i) {
    body(i);
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(kDirectRepeats);
}

// One collective's record, as a backend makes it, on a recorder of the
// default size that no group shares.
double record_us() {
  ddp::internal::FlightRecorder recorder("bench", "gloo", 0, 2, 2000, nullptr, nullptr);
  ddp::internal::Fingerprint fingerprint("allreduce", at::kFloat, 165, ddp::ReduceOp::kSum);
  return mean_us([&](int64_t i) {
    fingerprint.seq = static_cast<uint64_t>(i);
    const uint64_t id = recorder.queued(fingerprint);
    recorder.started(id);
    recorder.completed(id);
  });
}

// One timeline event, its name and arguments formatted as a bucket's are,
// on a timeline of its own keeping 20 steps of 1000 events.
double event_us() {
  ddp::internal::Timeline timeline("/nonexistent", 20, 1, 0);
  timeline.set_rank(0, 2);
  return mean_us([&](int64_t i) {
    if (i % 1000 == 0) {
      timeline.begin_step();
    }
    // Formatted as the reducer formats a bucket's (reducer_insight.cpp).
    timeline.complete(ddp::internal::Timeline::kBucketTrack, "bucket " + std::to_string(i % 4), i, i + 10,
                      ddp::internal::TimelineArgs()
                          .add("bucket", i % 4)
                          .add("iteration", i)
                          .add("bytes", int64_t{660})
                          .add("parameters", int64_t{4})
                          .add("ready_ms", 0.5)
                          .take());
  });
}

// The recording groups' highest record number so far, from the dump's text.
int64_t last_record_id() {
  const std::string text = ddp::internal::flight_recorder_json("bench");
  int64_t last = -1;
  for (size_t at = text.find("\"id\": "); at != std::string::npos; at = text.find("\"id\": ", at + 1)) {
    last = std::max<int64_t>(last, std::strtoll(text.c_str() + at + 6, nullptr, 10));
  }
  return last;
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
    // What one step records (its collectives, every rank steps) and how long
    // it takes, for the ToyModel (its step time from the rounds above) and
    // for bench/ddp_step_bench's 25M-parameter MLP (the median of 3 steps).
    struct Counted {
      const char* model;
      double step_us;
      int64_t collectives;
      int64_t buckets;
    };
    const auto count = [&](DdpModel& model, torch::optim::SGD& optimizer, const torch::Tensor& in,
                           const torch::Tensor& target) {
      const int64_t before = last_record_id();
      optimizer.zero_grad();
      torch::mse_loss(model(in), target).backward();
      optimizer.step();
      return std::make_pair(last_record_id() - before, static_cast<int64_t>(model->bucket_layout().size()));
    };
    std::vector<Counted> counted;
    const auto toy = count(*variants[0].model, *variants[0].optimizer, x, y);
    counted.push_back({"toy", best(variants[1].step_us), toy.first, toy.second});
    {
      torch::manual_seed(0);
      torch::nn::Sequential mlp;
      for (int layer = 0; layer < 4; ++layer) {
        mlp->push_back(torch::nn::Linear(2500, 2500));
        if (layer < 3) {
          mlp->push_back(torch::nn::ReLU());
        }
      }
      DdpModel model(mlp, ddp::DistributedDataParallelOptions().process_group(on_group));
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.001));
      const auto in = torch::randn({8, 2500});
      const auto target = torch::randn({8, 2500});
      count(model, optimizer, in, target); // warm-up: buckets rebuilt
      const double step = median_us(3, [&] {
        optimizer.zero_grad();
        torch::mse_loss(model(in), target).backward();
        optimizer.step();
      });
      const auto mlp_counts = count(model, optimizer, in, target);
      counted.push_back({"mlp", step, mlp_counts.first, mlp_counts.second});
    }
    if (world->rank() == 0) {
      const double record = record_us();
      const double event = event_us();
      for (const Counted& c : counted) {
        const int64_t events = 3 + 2 * c.buckets + 2 * c.collectives;
        std::printf("flight_recorder_bench backend=%s world=%d case=direct-cost model=%s step_us=%.1f "
                    "record_us=%.3f collectives_per_step=%lld recorder_ratio=%.4f event_us=%.3f "
                    "events_per_step=%lld timeline_ratio=%.4f\n",
                    world->backend_name().c_str(), world->size(), c.model, c.step_us, record,
                    static_cast<long long>(c.collectives), 1 + record * static_cast<double>(c.collectives) / c.step_us,
                    event, static_cast<long long>(events), 1 + event * static_cast<double>(events) / c.step_us);
      }
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
