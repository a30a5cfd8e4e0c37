// The PowerSGD communication hook on W ranks against one process. Both of
// PowerSGD's allreduces are linear in the gradients (see
// src/comm_hooks/powersgd_hook.cpp), so W ranks that each train on their slice of a
// global batch must end where one process ends that runs the same hook, in
// a world of size 1, on the whole batch: the mean of the ranks' error
// feedback is that process's error. Also the bytes the hook sends (closed
// form), the plain allreduce before start_powerSGD_iter, and the options'
// checks.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_powersgd_main
// prints one line per case on each rank, e.g.
//   [ok] powerSGD rank=1 start=2 buckets=default: max |ours - one process| 2.1e-07
//        (tolerance 1e-05), ... (on one line)
// and a summary; exits 1 if a case failed. Run alone (no launcher) it is a
// world of size 1.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp::comm_hooks::PowerSGDOptions;
using ddp::comm_hooks::PowerSGDState;
using ddp_test::Report;

constexpr int kSteps = 8;
constexpr double kLearningRate = 0.2;
// Float32 sums in a different order, through the normalisations of
// Gram-Schmidt (up to 4e-8 seen on 3 ranks): far below what 8 steps move a
// weight (about 0.05), and below what compression changes (1e-6 to 3e-4
// here: the closed-form gradients are nearly of low rank).
constexpr double kTolerance = 1e-6;

struct BucketSize {
  const char* name;
  double cap_mb;
};
// 0.0001 MiB is 104 bytes: each weight is a bucket with the next bias.
constexpr BucketSize kTiny{"tiny", 0.0001};
constexpr BucketSize kDefault{"default", 25.0};

ddp::DistributedDataParallelOptions options_for(const BucketSize& size,
                                                std::shared_ptr<ddp::ProcessGroup> group) {
  return ddp::DistributedDataParallelOptions()
      .process_group(std::move(group))
      .first_bucket_cap_mb(size.cap_mb)
      .bucket_cap_mb(size.cap_mb);
}

// A world of size 1 of this process alone, for the one-process reference.
std::shared_ptr<ddp::ProcessGroup> world_of_one() {
  return ddp::ProcessGroupGloo::create(std::make_shared<ddp::HashStore>(), 0, 1,
                                       ddp::ProcessGroupGlooOptions()
                                           .hostname("127.0.0.1")
                                           .group_name("powersgd_one_process"));
}

// Trains `model` kSteps steps of SGD on this rank's slices (or, in a world
// of size 1, on the whole global batch).
void train(ddp::DistributedDataParallel& model) {
  const auto& group = *model->process_group();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = group.size() == 1 && ddp::default_process_group()->size() > 1
                      ? ddp_test::global_batch(step)
                      : ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
  }
}

// Bytes and allreduce calls that PowerSGD sends for the closed-form MLP
// (Linear 8-16, 16-16, 16-16, 16-4) per compressed iteration, counted from
// the definition: a weight n x m is compressed when (n + m) r' * rate < n m
// (r' = min(n, m, r)), then sends n r' (P) and m r' (Q) elements; every
// other tensor is sent whole.
struct Traffic {
  int64_t numel;
  int64_t matrices; // compressed matrices
};
Traffic compressed_traffic(int64_t rank, double rate) {
  const int64_t shapes[4][2] = {{ddp_test::kHidden, ddp_test::kIn},
                                {ddp_test::kHidden, ddp_test::kHidden},
                                {ddp_test::kHidden, ddp_test::kHidden},
                                {ddp_test::kOut, ddp_test::kHidden}};
  Traffic traffic{0, 0};
  for (const auto& shape : shapes) {
    const int64_t n = shape[0];
    const int64_t m = shape[1];
    const int64_t r = std::min({n, m, rank});
    if (static_cast<double>((n + m) * r) * rate < static_cast<double>(n * m)) {
      traffic.numel += (n + m) * r;
      ++traffic.matrices;
    } else {
      traffic.numel += n * m;
    }
    traffic.numel += n; // the bias
  }
  return traffic;
}

int64_t mlp_numel() {
  return ddp_test::kHidden * (ddp_test::kIn + 1) + 2 * ddp_test::kHidden * (ddp_test::kHidden + 1) +
         ddp_test::kOut * (ddp_test::kHidden + 1);
}

// W ranks with PowerSGD against one process with PowerSGD on the whole
// batch; against plain averaging too, which must differ (else nothing was
// compressed) unless compression never started.
void parity(Report& report, const BucketSize& size, const PowerSGDOptions& options) {
  report.begin_case("powerSGD rank=" + std::to_string(options.matrix_approximation_rank()) +
                    " start=" + std::to_string(options.start_powerSGD_iter()) +
                    " error_feedback=" + (options.use_error_feedback() ? "on" : "off") +
                    " warm_start=" + (options.warm_start() ? "on" : "off") +
                    " buckets=" + size.name);
  auto group = ddp::default_process_group();
  auto net = ddp_test::make_closed_form_mlp();
  auto state = std::make_shared<PowerSGDState>(options);
  ddp::DistributedDataParallel model(net, options_for(size, group));
  model->register_comm_hook(ddp::comm_hooks::powerSGD(state));
  train(model);

  auto one_net = ddp_test::make_closed_form_mlp();
  auto one_state = std::make_shared<PowerSGDState>(options);
  ddp::DistributedDataParallel one(one_net, options_for(size, world_of_one()));
  one->register_comm_hook(ddp::comm_hooks::powerSGD(one_state));
  train(one);

  auto plain_net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel plain(plain_net, options_for(size, world_of_one()));
  train(plain);

  const auto difference = ddp_test::max_parameter_difference(*net, *one_net);
  report.expect_at_most(difference.value, kTolerance,
                        "max |ours - one process| (at " + difference.where + ")");
  const auto moved = ddp_test::max_parameter_difference(*one_net, *ddp_test::make_closed_form_mlp());
  report.expect(moved.value > 100 * kTolerance,
                "training barely moved the weights (" + Report::format(moved.value) + ")");
  const auto compression = ddp_test::max_parameter_difference(*one_net, *plain_net);
  const bool compresses = options.start_powerSGD_iter() < kSteps;
  report.note("max |PowerSGD - plain| " + Report::format(compression.value));
  if (compresses) {
    report.expect(compression.value > 10 * difference.value && compression.value > 0,
                  "PowerSGD ended where plain averaging does (max difference " +
                      Report::format(compression.value) + "): did it compress?");
  } else {
    report.expect(compression.value <= kTolerance,
                  "before start_powerSGD_iter the hook must average plainly");
  }

  report.expect(state->iteration() == kSteps,
                "iteration() is " + std::to_string(state->iteration()) + ", expected " +
                    std::to_string(kSteps));
  // Bytes, in closed form. Before start_powerSGD_iter: one allreduce of each
  // bucket. Then per bucket: one of its uncompressed tensors and Ps, and
  // one of its Qs if it has a compressed matrix.
  const auto buckets = static_cast<int64_t>(model->bucket_layout().size());
  const int64_t plain_steps = std::min<int64_t>(options.start_powerSGD_iter(), kSteps);
  const int64_t compressed_steps = kSteps - plain_steps;
  const Traffic traffic =
      compressed_traffic(options.matrix_approximation_rank(), options.min_compression_rate());
  const int64_t bucket_with_matrices = size.cap_mb < 1 ? traffic.matrices : (traffic.matrices > 0);
  const auto expected_bytes = static_cast<uint64_t>(
      4 * (plain_steps * mlp_numel() + compressed_steps * traffic.numel));
  const auto expected_calls =
      static_cast<uint64_t>(plain_steps * buckets + compressed_steps * (buckets + bucket_with_matrices));
  report.expect(state->bytes_allreduced() == expected_bytes,
                "bytes_allreduced() " + std::to_string(state->bytes_allreduced()) + ", expected " +
                    std::to_string(expected_bytes));
  report.expect(state->allreduce_calls() == expected_calls,
                "allreduce_calls() " + std::to_string(state->allreduce_calls()) + ", expected " +
                    std::to_string(expected_calls) + " (" + std::to_string(buckets) + " buckets)");
  report.note(std::to_string(buckets) + " buckets, " +
              std::to_string(compressed_steps > 0 ? traffic.numel * 4 : 0) +
              " bytes per compressed step vs " + std::to_string(mlp_numel() * 4) + " plain");
  if (compresses) {
    const auto stats = state->compression_stats();
    report.expect(stats.rate > 1, "compression_stats().rate is " + Report::format(stats.rate));
    report.expect(stats.numel_before == compressed_steps * mlp_numel(),
                  "compression_stats().numel_before is " + std::to_string(stats.numel_before));
    // Error feedback: on one rank alone (one process) the uncompressed
    // tensors lose nothing; the error is defined once compression ran.
    if (options.use_error_feedback()) {
      report.expect(one_state->error(0).defined() && state->error(0).defined(),
                    "no error feedback kept for bucket 0");
      double lost = 0;
      for (size_t b = 0; b < static_cast<size_t>(buckets); ++b) {
        if (one_state->error(b).defined()) {
          lost = std::max(lost, one_state->error(b).abs().max().item<double>());
        }
      }
      report.note("largest error feedback " + Report::format(lost));
      report.expect(lost > 0, "compression lost nothing: did it compress?");
    }
  }
  report.end_case();
}

template <typename Fn>
void expect_refused(Report& report, const std::string& what, Fn fn, const std::string& phrase) {
  try {
    fn();
    report.expect(false, what + ": accepted");
  } catch (const c10::Error& e) {
    report.expect(std::string(e.what()).find(phrase) != std::string::npos,
                  what + ": message does not say '" + phrase + "': " + e.msg());
  }
}

void options_checks(Report& report) {
  report.begin_case("PowerSGDOptions checks");
  expect_refused(
      report, "start_powerSGD_iter 1 with error feedback",
      [] { PowerSGDState state(PowerSGDOptions().start_powerSGD_iter(1)); },
      "start_powerSGD_iter must be at least 2 with use_error_feedback or warm_start (got 1)");
  expect_refused(
      report, "rank 0", [] { PowerSGDState state(PowerSGDOptions().matrix_approximation_rank(0)); },
      "matrix_approximation_rank must be at least 1 (got 0)");
  expect_refused(
      report, "null state", [] { ddp::comm_hooks::powerSGD(nullptr); }, "the state is null");
  PowerSGDState accepted(
      PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false));
  report.expect(accepted.iteration() == 0 && accepted.bytes_allreduced() == 0,
                "a fresh state has counted something");
  report.end_case();
}

} // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    Report report("ddp_powersgd_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    for (const BucketSize& size : {kDefault, kTiny}) {
      parity(report, size, PowerSGDOptions().start_powerSGD_iter(2));
      parity(report, size, PowerSGDOptions().start_powerSGD_iter(2).matrix_approximation_rank(2));
    }
    // Rank 3: QR instead of Gram-Schmidt; fresh random Q every iteration.
    parity(report, kDefault,
           PowerSGDOptions()
               .start_powerSGD_iter(0)
               .matrix_approximation_rank(3)
               .min_compression_rate(1)
               .use_error_feedback(false)
               .warm_start(false));
    // Never starts: the plain allreduce.
    parity(report, kDefault, PowerSGDOptions().start_powerSGD_iter(1000));
    options_checks(report);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_powersgd_main: %s\n", e.what());
    return 1;
  }
}
