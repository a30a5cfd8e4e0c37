// Stateful communication hooks across a checkpoint: a run stopped after
// kStop steps (save_checkpoint with the optimizer) and resumed in new
// objects (load_checkpoint) must end exactly where the uninterrupted run
// ends, for PowerSGD (layer-wise, with batch_tensors_with_same_shape, and
// batched) and post-local SGD (with the averager called by the program, and
// in a PostLocalSGDOptimizer). A resumed run whose hook restarts from a
// fresh state (registered after load_checkpoint) must not, or the test
// could not tell. Also: refusals (other options, another hook's state, a
// damaged state, a rank that cannot save its state; PostLocalSGDOptimizer's
// null and ZeRO arguments, a plain optimizer's file) and a state from a
// run of another size.
//
// Usage: build/ddprun --nproc-per-node 2 build/tests/ddp_hook_resume_main DIR
// (DIR: where the checkpoints go). Prints one line per case and a summary.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include <ddp/ddp.h>
#include <ddp/comm_hooks/post_local_sgd_hook.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp::comm_hooks::PowerSGDOptions;
using ddp::comm_hooks::PowerSGDState;
using ddp_test::Report;

constexpr int kSteps = 8;
constexpr int kStop = 5;

// A hook and its state, made afresh for each run.
struct Hook {
  std::shared_ptr<ddp::CommHookState> state;
  ddp::CommHook hook;
  // Post-local SGD's partner, called after each optimizer step.
  std::shared_ptr<ddp::model_averaging::PeriodicModelAverager> averager;
  // SGD's momentum. Local SGD takes none here: between averagings each
  // rank's momentum is its own, and a checkpoint keeps rank 0's.
  double momentum = 0.9;
  // Wraps the SGD optimizer (PostLocalSGDOptimizer), when set.
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::unique_ptr<torch::optim::Optimizer>)> wrap;
};
using MakeHook = std::function<Hook()>;

struct Run {
  torch::nn::Sequential net;
  ddp::DistributedDataParallel model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Hook hook;
};

Run make_run(const MakeHook& make_hook) {
  auto net = ddp_test::make_closed_form_mlp();
  ddp::DistributedDataParallel model(net);
  Hook hook = make_hook();
  std::unique_ptr<torch::optim::Optimizer> optimizer = std::make_unique<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.1).momentum(hook.momentum));
  if (hook.wrap) {
    optimizer = hook.wrap(std::move(optimizer));
  }
  return Run{net, model, std::move(optimizer), std::move(hook)};
}

void train(Run& run, int first, int last) {
  const auto& group = *run.model->process_group();
  for (int step = first; step < last; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    run.optimizer->zero_grad();
    torch::mse_loss(run.model(x), y).backward();
    run.optimizer->step();
    if (run.hook.averager) {
      run.hook.averager->average_parameters(run.model->parameters());
    }
  }
}

void resume_case(Report& report, const std::string& name, const MakeHook& make_hook, const std::string& dir) {
  report.begin_case(name + ": resumed == uninterrupted");
  const std::string path = dir + "/hook_resume_" + name + ".pt";

  Run whole = make_run(make_hook);
  whole.model->register_comm_hook(whole.hook.hook);
  train(whole, 0, kSteps);

  Run first = make_run(make_hook);
  first.model->register_comm_hook(first.hook.hook);
  train(first, 0, kStop);
  ddp::save_checkpoint(first.model, *first.optimizer, path);

  Run resumed = make_run(make_hook);
  resumed.model->register_comm_hook(resumed.hook.hook); // before loading: the state is loaded too
  ddp::load_checkpoint(resumed.model, *resumed.optimizer, path);
  if (resumed.hook.averager) {
    resumed.hook.averager->set_step(kStop); // what the program keeps of its own
  }
  train(resumed, kStop, kSteps);

  // The hook registered after loading starts from a fresh state.
  Run forgetful = make_run(make_hook);
  ddp::load_checkpoint(forgetful.model, *forgetful.optimizer, path);
  forgetful.model->register_comm_hook(forgetful.hook.hook);
  if (forgetful.hook.averager) {
    forgetful.hook.averager->set_step(kStop);
  }
  train(forgetful, kStop, kSteps);

  const auto difference = ddp_test::max_parameter_difference(*resumed.net, *whole.net);
  report.expect_at_most(difference.value, 0.0, "max |resumed - uninterrupted| (at " + difference.where + ")");
  const auto lost = ddp_test::max_parameter_difference(*forgetful.net, *whole.net);
  report.note("max |fresh hook state - uninterrupted| " + Report::format(lost.value));
  report.expect(lost.value > 0, "a hook restarted from a fresh state ends where the resumed one does: the test "
                                "cannot see whether the state was carried");
  if (auto* powersgd = dynamic_cast<PowerSGDState*>(resumed.hook.state.get())) {
    auto* reference = dynamic_cast<PowerSGDState*>(whole.hook.state.get());
    report.expect(powersgd->iteration() == reference->iteration() &&
                      powersgd->bytes_allreduced() == reference->bytes_allreduced() &&
                      powersgd->compression_stats().numel_after == reference->compression_stats().numel_after,
                  "the resumed state's counters differ from the uninterrupted one's");
  }
  report.end_case();
}

Hook powersgd_hook(PowerSGDOptions options, bool batched) {
  auto state = std::make_shared<PowerSGDState>(options);
  return Hook{state, batched ? ddp::comm_hooks::batched_powerSGD(state) : ddp::comm_hooks::powerSGD(state)};
}

void refusals(Report& report, const std::string& dir) {
  report.begin_case("refusals");
  const std::string path = dir + "/hook_resume_refusals.pt";
  Run saved = make_run([] { return powersgd_hook(PowerSGDOptions().start_powerSGD_iter(2), false); });
  saved.model->register_comm_hook(saved.hook.hook);
  train(saved, 0, 3);
  ddp::save_checkpoint(saved.model, path);

  // Other options: the memories would not fit.
  Run other = make_run([] {
    return powersgd_hook(PowerSGDOptions().start_powerSGD_iter(2).matrix_approximation_rank(2), false);
  });
  other.model->register_comm_hook(other.hook.hook);
  ddp_test::expect_error(report, [&] { ddp::load_checkpoint(other.model, path); },
                         "saved with matrix_approximation_rank = 1, this state has 2");
  // Another hook's state.
  auto local = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, nullptr, 2);
  Run foreign = make_run([] { return Hook{}; });
  foreign.model->register_comm_hook(ddp::comm_hooks::post_localSGD(local));
  ddp_test::expect_error(report, [&] { ddp::load_checkpoint(foreign.model, path); },
                         "holds the state of a powerSGD hook, and the model's hook is post_localSGD");
  report.expect(local->iteration() == 0, "a refused load changed the state");

  // Damaged and truncated states, straight to load_state.
  const std::string good = saved.hook.state->save_state();
  PowerSGDState fresh(PowerSGDOptions().start_powerSGD_iter(2));
  ddp_test::expect_error(report, [&] { fresh.load_state({"not a state"}, 0, 1); }, "is damaged");
  ddp_test::expect_error(report, [&] { fresh.load_state({good.substr(0, good.size() / 2)}, 0, 1); },
                         "is damaged");
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x40;
  ddp_test::expect_error(report, [&] { fresh.load_state({flipped}, 0, 1); }, "is damaged");
  ddp_test::expect_error(report, [&] { fresh.load_state({}, 0, 1); }, "holds no rank's state");
  report.expect(fresh.iteration() == 0, "a refused load_state changed the state");

  // A rank that cannot save its hook state: every rank fails, naming it.
  struct FailingOnRank1 : ddp::CommHookState {
    int rank;
    explicit FailingOnRank1(int r) : rank(r) {}
    std::string kind() const override {
      return "failing";
    }
    std::string save_state() const override {
      TORCH_CHECK(rank != 1, "this state cannot be saved");
      return "saved";
    }
    void load_state(const std::vector<std::string>&, int, int) override {}
  };
  Run failing = make_run([] { return Hook{}; });
  failing.model->register_comm_hook(ddp::comm_hooks::with_state(
      std::make_shared<FailingOnRank1>(failing.model->process_group()->rank()), ddp::comm_hooks::allreduce()));
  ddp_test::expect_error(report, [&] { ddp::save_checkpoint(failing.model, dir + "/hook_resume_failing.pt"); },
                         "save_checkpoint: rank 1 could not save its failing hook state");

  // PostLocalSGDOptimizer: what it refuses, and a plain optimizer's file.
  {
    auto averager = std::make_shared<ddp::model_averaging::PeriodicModelAverager>(2, 2);
    auto sgd = [&] {
      return std::make_unique<torch::optim::SGD>(saved.model->parameters(), torch::optim::SGDOptions(0.1));
    };
    ddp_test::expect_error(report, [&] { ddp::optim::PostLocalSGDOptimizer(nullptr, averager); },
                           "PostLocalSGDOptimizer: the optimizer is null");
    ddp_test::expect_error(
        report,
        [&] { ddp::optim::PostLocalSGDOptimizer(sgd(), std::shared_ptr<ddp::model_averaging::PeriodicModelAverager>()); },
        "PostLocalSGDOptimizer: the averager is null");
    ddp_test::expect_error(
        report,
        [&] {
          ddp::optim::PostLocalSGDOptimizer(
              std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD>>(saved.model->parameters(),
                                                                                      torch::optim::SGDOptions(0.1)),
              averager);
        },
        "the optimizer is a ZeroRedundancyOptimizer");
    ddp::optim::PostLocalSGDOptimizer wrapped(sgd(), averager);
    averager->set_step(5);
    torch::serialize::OutputArchive plain_archive;
    sgd()->save(plain_archive);
    std::ostringstream bytes;
    plain_archive.save_to(bytes);
    std::istringstream in(bytes.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    wrapped.load(archive);
    report.expect(wrapped.averager_step() == 0, "a plain optimizer's file left the averager at step " +
                                                    std::to_string(wrapped.averager_step()) + ", expected 0");
  }

  // A run of another size: every rank takes rank 0's state (no error feedback).
  const auto* mine = dynamic_cast<PowerSGDState*>(saved.hook.state.get());
  fresh.load_state({good, good, good, good, good}, 0, 1);
  report.expect(fresh.iteration() == mine->iteration(), "the iteration was not taken from rank 0's state");
  report.end_case();
}

} // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 2) {
      std::fprintf(stderr, "usage: ddp_hook_resume_main DIR\n");
      return 2;
    }
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    const std::string dir = ddp_test::run_directory(argv[1], "hook_resume_main", *group);
    Report report("ddp_hook_resume_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    const auto start = PowerSGDOptions().start_powerSGD_iter(2);
    resume_case(report, "powerSGD", [&] { return powersgd_hook(start, false); }, dir);
    resume_case(report, "powerSGD_same_shape_batches",
                [&] { return powersgd_hook(PowerSGDOptions(start).batch_tensors_with_same_shape(true), false); }, dir);
    resume_case(report, "powerSGD_rank3_no_warm_start",
                [&] { return powersgd_hook(PowerSGDOptions(start).matrix_approximation_rank(3).warm_start(false), false); },
                dir);
    resume_case(report, "batched_powerSGD", [&] { return powersgd_hook(start, true); }, dir);
    resume_case(report, "post_localSGD", [&] {
      // Local groups of one rank: after 2 global steps, each rank steps
      // alone, and the averager averages at steps 2, 4, 6 (the checkpoint is
      // taken after step 4, when the ranks agree: between averagings each
      // rank has parameters of its own, and a checkpoint keeps rank 0's).
      auto self = ddp::new_subgroups(1).mine;
      auto state = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, self, 2);
      return Hook{state, ddp::comm_hooks::post_localSGD(state),
                  std::make_shared<ddp::model_averaging::PeriodicModelAverager>(2, 2), /*momentum=*/0.0};
    }, dir);
    resume_case(report, "post_localSGD_optimizer", [&] {
      // The same with PyTorch's PostLocalSGDOptimizer: the averager's step
      // travels in the optimizer's state, with nothing kept by the program.
      auto self = ddp::new_subgroups(1).mine;
      auto state = std::make_shared<ddp::comm_hooks::PostLocalSGDState>(nullptr, self, 2);
      Hook hook{state, ddp::comm_hooks::post_localSGD(state), nullptr, /*momentum=*/0.0};
      hook.wrap = [](std::unique_ptr<torch::optim::Optimizer> sgd) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<ddp::optim::PostLocalSGDOptimizer>(
            std::move(sgd), std::make_shared<ddp::model_averaging::PeriodicModelAverager>(2, 2));
      };
      return hook;
    }, dir);
    refusals(report, dir);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_hook_resume_main: %s\n", e.what());
    return 1;
  }
}
