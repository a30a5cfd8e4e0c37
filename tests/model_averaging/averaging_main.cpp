// Model averaging as real processes: PeriodicModelAverager's schedule
// (warmup, period), HierarchicalModelAverager's levels over subgroups,
// average_parameters on several tensors, and PyTorch's argument checks.
// Each rank's parameters are (rank + 1) * (step + 1) before each call, so
// that after it they are either that (no averaging) or the mean over the
// group that averaged.

#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/rank_checks.h"

namespace {

using ddp_test::expect_error;
using ddp_test::list_of;
using ddp_test::Report;
namespace ma = ddp::model_averaging;

// With gradients: the averagers skip parameters without one (PyTorch).
std::vector<at::Tensor> params_at(int rank, int64_t step) {
  const double v = (rank + 1.0) * (step + 1);
  std::vector<at::Tensor> params = {torch::full({2, 3}, v), torch::full({4}, v, torch::kDouble)};
  for (auto& p : params) {
    p.mutable_grad() = torch::zeros_like(p);
  }
  return params;
}

// The mean of (r + 1) * (step + 1) over ranks [first, first + size).
double mean_over(int first, int size, int64_t step) {
  double sum = 0;
  for (int r = first; r < first + size; ++r) {
    sum += (r + 1.0) * (step + 1);
  }
  return sum / size;
}

bool holds(const std::vector<at::Tensor>& params, double value) {
  for (const auto& p : params) {
    if (!torch::allclose(p.to(torch::kDouble), torch::full(p.sizes(), value, torch::kDouble), 1e-12, 1e-12)) {
      return false;
    }
  }
  return true;
}

void periodic(Report& report, int rank, int world) {
  report.begin_case("PeriodicModelAverager(period 3, warmup 2): averages at steps 2, 5, 8");
  ma::PeriodicModelAverager averager(3, 2);
  std::string schedule;
  for (int64_t step = 0; step < 10; ++step) {
    auto params = params_at(rank, step);
    averager.average_parameters(params);
    const bool averaged = step >= 2 && (step - 2) % 3 == 0;
    report.expect(holds(params, averaged ? mean_over(0, world, step) : (rank + 1.0) * (step + 1)),
                  "step " + std::to_string(step));
    schedule += averaged ? "A" : ".";
  }
  report.expect(averager.step() == 10, "step() is " + std::to_string(averager.step()));
  // A parameter without a gradient is not averaged (step 11: 11 - 2 = 9).
  ma::PeriodicModelAverager once(1);
  auto params = params_at(rank, 3);
  auto frozen = torch::full({3}, rank + 1.0);
  once.average_parameters({params[0], frozen});
  report.expect(holds({params[0]}, mean_over(0, world, 3)) && holds({frozen}, rank + 1.0),
                "a parameter without a gradient was averaged, or one with none was not");
  report.note(schedule);
  report.end_case();
}

void hierarchical(Report& report, int rank, int world) {
  const int half = world / 2 > 0 ? world / 2 : 1;
  report.begin_case("HierarchicalModelAverager({2: " + std::to_string(half) + ", 4: " + std::to_string(world) +
                    "}, warmup 1)");
  ma::HierarchicalModelAverager averager({{2, half}, {4, world}}, 1);
  std::string schedule;
  for (int64_t step = 0; step < 9; ++step) {
    auto params = params_at(rank, step);
    averager.average_parameters(params);
    double expected = (rank + 1.0) * (step + 1);
    char mark = '.';
    if (step >= 1 && step % 4 == 0) {
      expected = mean_over(0, world, step);
      mark = 'W';
    } else if (step >= 1 && step % 2 == 0) {
      expected = mean_over(rank / half * half, half, step);
      mark = 'h';
    }
    report.expect(holds(params, expected), "step " + std::to_string(step));
    schedule += mark;
  }
  report.note(schedule);
  report.end_case();
}

void errors(Report& report, int world) {
  report.begin_case("PyTorch's argument checks");
  const std::string w = std::to_string(world);
  expect_error(report, [] { ma::PeriodicModelAverager(0); }, "PeriodicModelAverager: period must be a positive value (got 0)");
  expect_error(report, [] { ma::PeriodicModelAverager(-2); }, "period must be a positive value (got -2)");
  expect_error(report, [] { ma::PeriodicModelAverager(4, -1); }, "warmup_steps must be a non-negative number (got -1)");
  expect_error(report, [] { ma::HierarchicalModelAverager({}); }, "period_group_sizes must not be empty");
  expect_error(report, [world] { ma::HierarchicalModelAverager({{2, world + 1}}); },
               "the last group size must be the group's size (" + w + "), got " + std::to_string(world + 1));
  expect_error(report, [world] { ma::HierarchicalModelAverager({{0, world}}); }, "period 0 (entry 0) must be a positive value");
  expect_error(report, [world] { ma::HierarchicalModelAverager({{4, world}}, -3); }, "warmup_steps must be a non-negative");
  if (world > 1) {
    expect_error(report, [world] { ma::HierarchicalModelAverager({{2, world + 1}, {4, world}}); },
                 "group size " + std::to_string(world + 1) + " (entry 0) must be positive and divide the group's size " + w);
  }
  report.end_case();
}

void subgroup_average(Report& report, int rank, int world) {
  report.begin_case("average_parameters over a subgroup; outside it, nothing changes");
  auto first = ddp::new_group({0});
  auto params = params_at(rank, 0);
  ma::average_parameters(params, first);
  report.expect(holds(params, rank + 1.0), "a group of one, or a non-member, changed the parameters");
  auto all = params_at(rank, 1);
  ma::average_parameters(all);
  report.expect(holds(all, mean_over(0, world, 1)), "the default group's average");
  report.end_case();
}

// --dump PREFIX: the schedules of pytorch_averaging_parity.py, every call's
// parameters, pickled into PREFIX.rank<r>.pt.
void dump(const std::string& prefix, int rank, int world) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericList periodic(c10::AnyType::get());
  ma::PeriodicModelAverager averager(3, 2);
  for (int64_t step = 0; step < 10; ++step) {
    auto params = params_at(rank, step);
    averager.average_parameters(params);
    periodic.push_back(list_of(params));
  }
  out.insert("periodic", periodic);
  const int half = world / 2 > 0 ? world / 2 : 1;
  ma::HierarchicalModelAverager levels({{2, half}, {4, world}}, 1);
  c10::impl::GenericList hierarchical(c10::AnyType::get());
  for (int64_t step = 0; step < 9; ++step) {
    auto params = params_at(rank, step);
    levels.average_parameters(params);
    hierarchical.push_back(list_of(params));
  }
  out.insert("hierarchical", hierarchical);
  ddp_test::write_rank_pickle(out, prefix, rank);
}

} // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    const int rank = group->rank();
    const int world = group->size();
    if (argc == 3 && std::string(argv[1]) == "--dump") {
      dump(argv[2], rank, world);
      ddp::destroy_process_group();
      return 0;
    }
    Report report("averaging_main (rank " + std::to_string(rank) + " of " + std::to_string(world) + ")");
    periodic(report, rank, world);
    hierarchical(report, rank, world);
    errors(report, world);
    subgroup_average(report, rank, world);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "averaging_main: %s\n", e.what());
    return 1;
  }
}
