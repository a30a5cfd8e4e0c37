// DistributedDataParallel with uneven inputs (ddp::Join) and checkpoints,
// under real processes.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_join_checkpoint_main \
//       SCRATCH_DIR build/tests/ddp_checkpoint_plain_load
// prints one line per case on each rank and a summary; exits 1 if a case
// failed. SCRATCH_DIR receives the checkpoint files, removed at the end.
//
// Join: rank r has 3 + r batches. Every rank must finish, with the
// parameters of one process that, at each step, sums the gradients of the
// ranks still training and divides by the world size (PyTorch's
// divide_by_initial_world_size).
//
// Checkpoint: save_checkpoint on every rank, load_checkpoint into fresh
// replicas (parameters, buffers and optimizer state must come back), and
// the file read by plain `torch::load` in a process without ddp
// (ddp_checkpoint_plain_load).

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "nn/closed_form.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::Report;

constexpr double kLearningRate = 0.2;
constexpr double kTolerance = 1e-5;
constexpr int64_t kRowsPerBatch = 4;
constexpr int kMaxRanks = 16;

int batches_of(int rank) {
  return 3 + rank;
}

// Rank `rank`'s batch `step`: its own samples, distinct from every other's.
std::pair<torch::Tensor, torch::Tensor> uneven_batch(int step, int rank) {
  return ddp_test::samples((step * kMaxRanks + rank) * kRowsPerBatch, kRowsPerBatch);
}

void join_uneven_inputs(Report& report, const std::string& name,
                        const std::function<torch::nn::Sequential()>& make_net,
                        const ddp::DistributedDataParallelOptions& options) {
  report.begin_case("join, rank r has 3 + r batches: " + name);
  auto group = ddp::default_process_group();
  const int rank = group->rank();
  const int world_size = group->size();
  const int longest = batches_of(world_size - 1);

  // The reference, in this process: every step sums the gradients of the
  // ranks that still have a batch, and divides by the world size.
  auto initial = make_net();
  ddp_test::init_closed_form(*initial);
  auto reference = make_net();
  ddp_test::init_closed_form(*reference);
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(kLearningRate));
  for (int step = 0; step < longest; ++step) {
    reference_optimizer.zero_grad();
    for (int r = 0; r < world_size; ++r) {
      if (step < batches_of(r)) {
        auto [x, y] = uneven_batch(step, r);
        torch::mse_loss(reference->forward(x), y).backward();
      }
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& p : reference->parameters()) {
        p.grad().div_(world_size);
      }
    }
    reference_optimizer.step();
  }

  auto net = make_net();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLearningRate));
  int64_t shadowed = -1;
  {
    ddp::Join join(model);
    for (int step = 0; step < batches_of(rank); ++step) {
      auto [x, y] = uneven_batch(step, rank);
      optimizer.zero_grad();
      torch::mse_loss(model(x), y).backward();
      optimizer.step();
    }
    shadowed = join.finish();
  }
  report.expect(shadowed == longest - batches_of(rank),
                "finish() says " + std::to_string(shadowed) + " steps were shadowed, expected " +
                    std::to_string(longest - batches_of(rank)));
  const double across = ddp_test::max_difference_from_rank0(*group, net->parameters());
  report.expect(across == 0,
                "parameters differ from rank 0's by " + std::to_string(across) + " after Join");
  const auto difference = ddp_test::max_parameter_difference(*net, *reference);
  report.expect_at_most(difference.value, kTolerance,
                        "max |ours - reference| (at " + difference.where + ")");
  report.note("shadowed " + std::to_string(shadowed) + " steps");
  const auto moved = ddp_test::max_parameter_difference(*reference, *initial);
  report.expect(moved.value > 100 * kTolerance, "training barely moved the weights");
  report.end_case();
}

// Whether `module`'s buffers equal rank 0's `reference` buffers (the ones
// save_checkpoint wrote: each rank's own running statistics differ, since
// each forward updates them with the rank's own batch).
bool has_rank0_buffers(ddp::ProcessGroup& group, const torch::nn::Module& module,
                       const torch::nn::Module& reference) {
  auto mine = module.buffers();
  auto theirs = reference.buffers();
  if (mine.size() != theirs.size()) {
    return false;
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    auto rank0 = theirs[i].clone();
    group.broadcast(rank0, {/*root_rank=*/0})->wait();
    if (!torch::equal(mine[i], rank0)) {
      return false;
    }
  }
  return true;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

void checkpoint_round_trip(Report& report, const std::string& scratch_dir,
                           const std::string& plain_loader) {
  report.begin_case("checkpoint: save, load into fresh replicas, load without ddp");
  auto group = ddp::default_process_group();
  const int rank = group->rank();
  const char* port = std::getenv("MASTER_PORT"); // unique to this ddprun job
  const std::string path =
      scratch_dir + "/ddp_checkpoint_" + (port != nullptr ? port : "alone") + ".pt";
  const auto sgd = torch::optim::SGDOptions(kLearningRate).momentum(0.9);

  auto net = ddp_test::make_bn_mlp();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net);
  torch::optim::SGD optimizer(model->parameters(), sgd);
  auto train_step = [&](ddp::DistributedDataParallel& m, torch::optim::SGD& o, int step) {
    auto [x, y] = ddp_test::rank_batch(step, rank, group->size());
    o.zero_grad();
    torch::mse_loss(m(x), y).backward();
    o.step();
  };
  for (int step = 0; step < 3; ++step) {
    train_step(model, optimizer, step);
  }
  ddp::save_checkpoint(model, optimizer, path);
  // save_checkpoint ends with a barrier: the files are there for every rank.
  report.expect(file_exists(path), "no checkpoint at " + path + " after save_checkpoint");
  report.expect(file_exists(path + ".optimizer"),
                "no optimizer state at " + path + ".optimizer after save_checkpoint");

  // Fresh replicas, with different random parameters and buffers per rank.
  torch::manual_seed(77 + rank);
  auto fresh = ddp_test::make_bn_mlp();
  {
    torch::NoGradGuard no_grad;
    for (auto& b : fresh->buffers()) {
      if (b.is_floating_point()) {
        b.uniform_(0.5, 2.0);
      }
    }
  }
  ddp::DistributedDataParallel fresh_model(fresh);
  torch::optim::SGD fresh_optimizer(fresh_model->parameters(), sgd);
  ddp::load_checkpoint(fresh_model, fresh_optimizer, path);
  report.expect(ddp_test::max_parameter_difference(*fresh, *net).value == 0,
                "loaded parameters differ from the saved ones");
  report.expect(has_rank0_buffers(*group, *fresh, *net),
                "loaded buffers differ from the saved ones (rank 0's)");
  report.expect(ddp_test::max_difference_from_rank0(*group, ddp_test::state_of(*fresh)) == 0,
                "loaded state differs across ranks");

  if (rank == 0) {
    // The names carry no wrapper prefix: plain LibTorch reads the file.
    const std::string expected = path + ".expected.txt";
    const std::string plain = path + ".plain.txt";
    report.expect(ddp_test::write_state_text(*net, expected), "cannot write " + expected);
    const std::string command = "'" + plain_loader + "' '" + path + "' '" + plain + "'";
    const int status = std::system(command.c_str());
    report.expect(status == 0, "the plain loader failed (" + command + ")");
    const auto want = read_lines(expected);
    const auto got = read_lines(plain);
    report.expect(!want.empty() && got.size() == want.size(),
                  "the plain loader wrote " + std::to_string(got.size()) + " tensors, expected " +
                      std::to_string(want.size()));
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      report.expect(got[i] == want[i], "plain torch::load gave a different " +
                                           want[i].substr(0, want[i].find(' ')));
    }
    std::remove(expected.c_str());
    std::remove(plain.c_str());
  }

  // The optimizer's momentum came back too: one more step on both replicas
  // ends equal (momentum 0.9 would make a missing state obvious).
  train_step(model, optimizer, 3);
  train_step(fresh_model, fresh_optimizer, 3);
  std::vector<torch::Tensor> fresh_grads;
  for (const auto& p : fresh->parameters()) {
    fresh_grads.push_back(p.grad());
  }
  report.expect(ddp_test::max_difference_from_rank0(*group, fresh_grads) == 0,
                "after load_checkpoint the replicas' gradients differ across ranks: "
                "DistributedDataParallel no longer reduces them");
  report.expect_at_most(ddp_test::max_parameter_difference(*fresh, *net).value, 1e-6,
                        "after one more step, max |loaded - original|");

  group->barrier()->wait();
  if (rank == 0) {
    std::remove(path.c_str());
    std::remove((path + ".optimizer").c_str());
  }
  report.end_case();
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ddp_join_checkpoint_main SCRATCH_DIR PLAIN_LOADER\n");
    return 2;
  }
  try {
    auto group = ddp::init_process_group();
    Report report("ddp_join_checkpoint_main (rank " + std::to_string(group->rank()) + " of " +
                  std::to_string(group->size()) + ")");
    const auto tiny_buckets =
        ddp::DistributedDataParallelOptions().first_bucket_cap_mb(0.0001).bucket_cap_mb(0.0001);
    join_uneven_inputs(report, "MLP, buckets=tiny", ddp_test::make_mlp, tiny_buckets);
    join_uneven_inputs(report, "MLP with BatchNorm1d (buffer broadcasts), buckets=default",
                       ddp_test::make_bn_mlp, {});
    checkpoint_round_trip(report, argv[1], argv[2]);
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_join_checkpoint_main: %s\n", e.what());
    return 1;
  }
}
