// mnist_train: a small convolutional network trained on MNIST-format data by
// several ranks with DistributedDataParallel. A program to copy: it shards
// the data with DistributedSampler, shows progress on rank 0, evaluates on a
// held-out set every epoch, saves a checkpoint every epoch (and every N
// steps with --checkpoint-every N, the sampler's position included), resumes
// from it exactly, and writes metrics to a CSV file.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/examples/mnist_train --checkpoint-dir /tmp/mnist_ckpt --csv /tmp/mnist.csv
// trains 3 epochs on a generated MNIST-like set and prints, on rank 0 only (a
// line per fifth of an epoch; on a terminal, one progress bar instead):
//   [rank 0]: mnist_train: 2 ranks on cpu (backend gloo, BLAS OpenBLAS, 1 thread); synthetic data: 6000 training and 1000 test images (seed 1)
//   [rank 0]: mnist_train: 3 epochs of 47 steps; batch 64 per rank, 128 per step in all; SGD lr 0.01 momentum 0.9
//   [rank 0]: epoch 1/3  step 10/47  loss 2.3104  8520 samples/s  ETA 0.5s
//   ...
//   [rank 0]: epoch 1/3: train loss 1.9761, test accuracy 0.7460 (746/1000), 8771 samples/s, 0.7s; saved /tmp/mnist_ckpt/epoch-1.pt
//   ...
//   [rank 0]: epoch 3/3: train loss 0.1145, test accuracy 0.9660 (966/1000), 8682 samples/s, 0.7s; saved /tmp/mnist_ckpt/epoch-3.pt
//   [rank 0]: final parameters: checksum 7f85af7ae58a464a (21840 values); they agree across 2 ranks (max difference 0)
// Add --resume to continue from the newest checkpoint (implied when the
// launcher restarted the job: ddprun --max-restarts 3 ...), --data DIR to read
// MNIST's IDX files, --help for every flag. Run with no launcher, it trains
// alone as a world of size 1. Each rank uses cuda:<LOCAL_RANK> when CUDA is
// available, else the CPU. Exit status: 0 when trained, 1 on an error
// (parameters that differ across ranks included), 2 on a bad flag or
// environment. See examples/mnist/README.md.

#include <torch/torch.h>

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "../common/checksum.h"
#include "checkpoints.h"
#include "data.h"
#include "flags.h"
#include "hooks.h"
#include "net.h"
#include "progress.h"

namespace {

// "OpenBLAS, 1 thread": what the header line says of the BLAS, so that a
// slow run on the reference BLAS, or on more BLAS threads than cores, shows.
std::string blas_summary() {
  const int threads = ddp::blas_num_threads();
  return ddp::blas_in_use().name +
      (threads > 0 ? ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") : "");
}

using mnist::Flags;
using mnist::FlagError;

// "1 rank", "2 ranks".
std::string ranks(int count) {
  return std::to_string(count) + (count == 1 ? " rank" : " ranks");
}

// ---- Device ------------------------------------------------------------------------

// "cuda:<LOCAL_RANK>" when CUDA is available, else the CPU: one GPU per rank,
// numbered on each node from 0.
torch::Device pick_device(const ddp::WorldInfo& world) {
  if (!torch::cuda::is_available()) {
    std::printf("CUDA is not available (no GPU, or a CPU-only LibTorch): training on the CPU\n");
    return torch::kCPU;
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (world.local_rank >= gpus) {
    throw FlagError("LOCAL_RANK is " + std::to_string(world.local_rank) + " but this node has " +
                    std::to_string(gpus) + " visible CUDA device(s): start at most " +
                    std::to_string(gpus) + " ranks per node (--nproc-per-node)");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
}

// ---- Restarts ------------------------------------------------------------------------
//
// A launcher that restarts a failed job (ddprun --max-restarts N, torchrun
// --max-restarts N) starts every rank again with the number of restarts so
// far in DDP_RESTART_COUNT (ddprun) and TORCHELASTIC_RESTART_COUNT (both);
// Slurm sets SLURM_RESTART_COUNT in a requeued batch job (sbatch --requeue,
// scontrol requeue, a node failure), and its srun steps inherit it. Their
// sum is above 0 when any of them restarted the job (torchrun inside a
// requeued Slurm job starts again at TORCHELASTIC_RESTART_COUNT=0).
// When it is above 0 the job was restarted, and resumes from its newest
// checkpoint as if --resume had been given.

int64_t restart_count_from_env() {
  int64_t restarts = 0;
  // DDP_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT are ddprun's one count.
  bool counted_launcher = false;
  for (const char* name : {"DDP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') {
      continue;
    }
    char* end = nullptr;
    const long long count = std::strtoll(value, &end, 10);
    if (*end != '\0' || count < 0) {
      throw FlagError(std::string(name) + " must be an integer >= 0 (got '" + value + "')");
    }
    const bool slurm = std::strcmp(name, "SLURM_RESTART_COUNT") == 0;
    if (slurm || !counted_launcher) {
      restarts += count;
      counted_launcher = counted_launcher || !slurm;
    }
  }
  return restarts;
}

// Tests only (tests/examples/run_mnist_train_test.sh, mode restart):
// MNIST_TRAIN_TEST_CRASH=RANK:EPOCH:STEP makes that rank kill itself with
// SIGKILL after that step of the first attempt, as a crashed rank would die,
// so that the test can check that a restart resumes to the same result.
struct TestCrash {
  int rank = -1;
  int64_t epoch = 0;
  int64_t step = 0;
};

std::optional<TestCrash> test_crash_from_env(int64_t restart_count) {
  const char* value = std::getenv("MNIST_TRAIN_TEST_CRASH");
  if (value == nullptr || restart_count > 0) {
    return std::nullopt;
  }
  TestCrash crash;
  long long epoch = 0;
  long long step = 0;
  if (std::sscanf(value, "%d:%lld:%lld", &crash.rank, &epoch, &step) != 3) {
    throw FlagError(std::string("MNIST_TRAIN_TEST_CRASH must be RANK:EPOCH:STEP (got '") +
                    value + "')");
  }
  crash.epoch = epoch;
  crash.step = step;
  return crash;
}

// ---- Metrics ---------------------------------------------------------------------

const char* const kCsvHeader = "epoch,train_loss,test_accuracy,samples_per_s,seconds";

// Prepares the CSV file for a run that starts after `completed_epochs`: keeps
// the header and the rows of those epochs (a job killed after writing a row
// but before saving its checkpoint trains that epoch again), drops the rest.
void start_csv(const std::string& path, int64_t completed_epochs) {
  std::ostringstream kept;
  kept << kCsvHeader << "\n";
  std::ifstream in(path);
  std::string line;
  while (completed_epochs > 0 && std::getline(in, line)) {
    const long long epoch = std::atoll(line.c_str()); // 0 for the header
    if (epoch >= 1 && epoch <= completed_epochs) {
      kept << line << "\n";
    }
  }
  mnist::write_atomically(path, kept.str());
}

void append_csv(const std::string& path, int64_t epoch, double train_loss, double accuracy,
                double samples_per_s, double seconds) {
  std::ofstream out(path, std::ios::app);
  char row[160];
  std::snprintf(row, sizeof row, "%lld,%.6f,%.6f,%.1f,%.3f\n", static_cast<long long>(epoch),
                train_loss, accuracy, samples_per_s, seconds);
  out << row;
  if (!out) {
    throw std::runtime_error("cannot append to " + path);
  }
}

// ---- Evaluation ---------------------------------------------------------------------

struct Accuracy {
  int64_t correct = 0;
  int64_t total = 0;
};

// Every rank evaluates a contiguous share of the test set with the inner
// module, then the counts are summed across ranks. The inner module, not the
// DDP wrapper: evaluation needs no gradient synchronisation, and the
// wrapper's forward is a collective that would have every rank wait for the
// others at each batch. Without per-batch collectives the shares may be
// uneven, so unlike DistributedSampler, which pads the last round by
// repeating examples, no example is counted twice.
//
// Under --fsdp, `net` is the FullyShardedDataParallel model itself (its
// parameters live sharded between calls); its forward under no_grad gathers
// each unit and frees it, and every rank runs the same number of batches
// (ceil(n / W / batch)), the last ones possibly empty.
Accuracy evaluate(torch::nn::Module& net, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                  bool collective_forward, mnist::ImageDataset& test, ddp::ProcessGroup& group,
                  torch::Device device, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  net.eval();
  const auto n = static_cast<int64_t>(test.size().value());
  const int64_t begin = n * group.rank() / group.size();
  const int64_t end = n * (group.rank() + 1) / group.size();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  // The most examples a rank has: with a collective forward, every rank runs
  // that many batches.
  const int64_t most = collective_forward ? (n + group.size() - 1) / group.size() : end - begin;
  for (int64_t first = begin; first < begin + most; first += batch_size) {
    std::vector<size_t> indices;
    for (int64_t i = first; i < std::min(end, first + batch_size); ++i) {
      indices.push_back(static_cast<size_t>(i));
    }
    if (indices.empty()) {
      forward(torch::zeros({0, 1, 28, 28}, torch::TensorOptions().device(device)));
      continue;
    }
    auto batch = test.get_batch(indices);
    auto predicted = forward(batch.data.to(device)).argmax(1);
    correct += predicted.eq(batch.target.to(device)).sum();
  }
  net.train();
  // One collective per evaluation. On the rank's device: NCCL only reduces
  // GPU tensors (Gloo takes both).
  auto counts = torch::stack({correct, torch::full({}, end - begin, correct.options())});
  group.allreduce(counts)->wait();
  return {counts[0].item<int64_t>(), counts[1].item<int64_t>()};
}

// ---- Checksum ------------------------------------------------------------------------

// A checksum of every parameter's bytes, in registration order: equal
// checksums mean bit-identical parameters (the resume test compares them).
std::string parameter_checksum(const torch::nn::Module& module, int64_t* values) {
  examples::Checksum checksum;
  for (const auto& p : module.parameters()) {
    checksum.add(p);
  }
  *values = checksum.values();
  return checksum.hex();
}

// ---- Training --------------------------------------------------------------------------

int train(const Flags& flags, const ddp::WorldInfo& world, torch::Device device,
          int64_t restart_count) {
  const bool is_rank0 = world.rank == 0;
  const std::optional<TestCrash> test_crash = test_crash_from_env(restart_count);

  // The same data on every rank: read from the same files, or generated from
  // the same seed. The sampler then gives each rank its share.
  std::optional<mnist::Split> split;
  std::string data_text;
  if (!flags.data.empty()) {
    auto read = mnist::read_idx_dir(flags.data);
    split.emplace(mnist::Split{read.train.head(flags.train_size.value_or(INT64_MAX)),
                               read.test.head(flags.test_size.value_or(INT64_MAX))});
    data_text = "MNIST files in " + flags.data;
  } else {
    split.emplace(mnist::make_synthetic(flags.train_size.value_or(6000),
                                        flags.test_size.value_or(1000), flags.seed));
    data_text = "synthetic data";
  }
  const auto train_size = split->train.size().value();
  const auto test_size = split->test.size().value();
  if (train_size == 0) {
    throw std::runtime_error("the training set is empty (" + data_text + ")");
  }

  auto group = ddp::init_process_group();

  // Rank 0 alone looks at the output directory and the CSV file (only rank 0
  // writes files), then tells the others where to start: the number of
  // epochs already done and the steps of the next (--checkpoint-every), or
  // -1 if it failed (its error follows).
  int64_t completed_epochs = 0;
  int64_t completed_steps = 0;
  std::string prepare_error;
  if (is_rank0) {
    if (restart_count > 0) {
      std::printf("mnist_train: the launcher restarted the job (restart %lld): %s\n",
                  static_cast<long long>(restart_count),
                  flags.checkpoint_dir.empty()
                      ? "no --checkpoint-dir to resume from, so training starts over"
                      : "resuming from the newest checkpoint, as with --resume");
    }
    try {
      if (!flags.checkpoint_dir.empty()) {
        mnist::make_directories(flags.checkpoint_dir);
        auto sidecar = mnist::read_sidecar(flags.checkpoint_dir);
        if (sidecar && flags.resume) {
          if (sidecar->format != flags.checkpoint_format) {
            throw std::runtime_error("the checkpoint in " + flags.checkpoint_dir + " is in format " + sidecar->format +
                                     "; resume it with --checkpoint-format " + sidecar->format);
          }
          completed_epochs = sidecar->completed_epochs;
          completed_steps = sidecar->completed_steps;
          if (sidecar->world_size != group->size() || sidecar->batch_size != flags.batch_size ||
              sidecar->seed != flags.seed) {
            std::printf("mnist_train: note: the checkpoint was made with %lld ranks, batch %lld, "
                        "seed %llu; this run has %d ranks, batch %lld, seed %llu, so it will not "
                        "match an uninterrupted run\n",
                        static_cast<long long>(sidecar->world_size),
                        static_cast<long long>(sidecar->batch_size),
                        static_cast<unsigned long long>(sidecar->seed), group->size(),
                        static_cast<long long>(flags.batch_size),
                        static_cast<unsigned long long>(flags.seed));
          }
        } else if (sidecar) {
          std::printf("mnist_train: note: %s holds a checkpoint (%s); starting from "
                      "scratch over it (add --resume to continue it)\n",
                      flags.checkpoint_dir.c_str(),
                      mnist::checkpoint_tag(sidecar->completed_epochs, sidecar->completed_steps).c_str());
        } else if (flags.resume) {
          std::printf("mnist_train: no checkpoint in %s yet; starting from epoch 1\n",
                      flags.checkpoint_dir.c_str());
        }
      }
      if (!flags.csv.empty()) {
        start_csv(flags.csv, completed_epochs);
      }
    } catch (const std::exception& e) {
      prepare_error = ddp::error_message(e);
      completed_epochs = -1;
    }
  }
  auto start = torch::tensor({completed_epochs, completed_steps}, torch::TensorOptions().dtype(torch::kLong))
                   .to(device);
  group->broadcast(start)->wait();
  completed_epochs = start[0].item<int64_t>();
  completed_steps = start[1].item<int64_t>();
  if (completed_epochs < 0) {
    if (is_rank0) {
      std::fprintf(stderr, "mnist_train: %s\n", prepare_error.c_str());
    }
    return 1;
  }

  // The same seed on every rank gives the same initial parameters; DDP's
  // constructor would make them equal anyway (it broadcasts rank 0's).
  // With --fsdp the model is FullyShardedDataParallel over FsdpConvNet (the
  // same layers, each a unit): each rank keeps a shard of every layer.
  torch::manual_seed(flags.seed);
  std::optional<ddp::DistributedDataParallel> model;
  std::optional<ddp::FullyShardedDataParallel> fsdp;
  std::shared_ptr<torch::nn::Module> wrapper; // model's or fsdp's module
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  if (!flags.fsdp.empty()) {
    mnist::FsdpConvNet net;
    net->to(device);
    fsdp.emplace(net, ddp::FullyShardedDataParallelOptions().sharding_strategy(
                          flags.fsdp == "full" ? ddp::ShardingStrategy::kFullShard
                                               : ddp::ShardingStrategy::kShardGradOp));
    wrapper = fsdp->ptr();
    forward = [&fsdp](const torch::Tensor& x) { return (*fsdp)(x); };
  } else {
    mnist::ConvNet net;
    net->to(device);
    auto ddp_options = ddp::DistributedDataParallelOptions()
                           .bucket_cap_mb(flags.bucket_cap_mb)
                           .first_bucket_cap_mb(std::min(1.0, flags.bucket_cap_mb));
    if (device.is_cuda()) {
      ddp_options.device_ids({device});
    }
    model.emplace(net, ddp_options);
    wrapper = model->ptr();
    forward = [&model](const torch::Tensor& x) { return (*model)(x); };
  }
  // --comm-hook: registered before a checkpoint is loaded (below), which
  // then restores the hook's state too.
  std::optional<mnist::CommHooks> hooks;
  if (model) {
    hooks.emplace(flags, *model);
  }
  // With --optimizer-sharding zero1 each rank keeps the momentum of its
  // shard of the parameters only; with zero2 also only its shard's
  // gradients, and each bucket's step runs during backward. The loop below
  // is the same either way.
  const auto sgd_options = torch::optim::SGDOptions(flags.lr).momentum(flags.momentum);
  std::unique_ptr<torch::optim::Optimizer> sgd;
  if (flags.optimizer_sharding != "none") {
    const int stage = flags.optimizer_sharding == "zero2" ? 2 : 1;
    auto zero = std::make_unique<ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD>>(
        (*model)->parameters(), sgd_options, ddp::optim::ZeroRedundancyOptimizerOptions().stage(stage));
    if (stage == 2) {
      zero->overlap_with(*model);
    }
    sgd = std::move(zero);
  } else {
    // Under --fsdp, wrapper->parameters() are this rank's shards.
    sgd = std::make_unique<torch::optim::SGD>(wrapper->parameters(), sgd_options);
  }
  if (hooks) {
    sgd = hooks->wrap_optimizer(std::move(sgd)); // local SGD: steps, then averages
  }
  torch::optim::Optimizer& optimizer = *sgd;
  const mnist::Trained trained{model ? &*model : nullptr, fsdp ? &*fsdp : nullptr, &optimizer};

  // Each rank's share, reshuffled every epoch from seed + epoch. The data
  // loader must not shuffle on its own: the sampler's order is the one every
  // rank agrees on, and a loader's own shuffle would make the shares overlap.
  ddp::DistributedSampler sampler(train_size, ddp::DistributedSamplerOptions().seed(
                                                  static_cast<int64_t>(flags.seed)));
  auto loader = torch::data::make_data_loader(
      split->train, sampler, torch::data::DataLoaderOptions(static_cast<size_t>(flags.batch_size)));
  const auto steps = static_cast<int64_t>(
      (sampler.num_samples() + static_cast<size_t>(flags.batch_size) - 1) /
      static_cast<size_t>(flags.batch_size));

  if (is_rank0) {
    std::printf("mnist_train: %s on %s (backend %s, BLAS %s); %s: %zu training and %zu test "
                "images (seed %llu)\n",
                ranks(group->size()).c_str(), device.str().c_str(),
                group->backend_name().c_str(), blas_summary().c_str(), data_text.c_str(),
                train_size, test_size, static_cast<unsigned long long>(flags.seed));
    std::printf("mnist_train: %lld epoch%s of %lld steps; batch %lld per rank, %lld per step in "
                "all; SGD lr %g momentum %g%s\n",
                static_cast<long long>(flags.epochs), flags.epochs == 1 ? "" : "s",
                static_cast<long long>(steps),
                static_cast<long long>(flags.batch_size),
                static_cast<long long>(flags.batch_size * group->size()), flags.lr,
                flags.momentum,
                !flags.fsdp.empty() ? (", FullyShardedDataParallel (" + flags.fsdp + ")").c_str()
                : flags.optimizer_sharding == "none"
                    ? ""
                    : (", sharded over the ranks (" + flags.optimizer_sharding + ")").c_str());
    if (flags.comm_hook == "powersgd") {
      std::printf("mnist_train: communication hook powersgd: rank %lld, plain for the first %lld "
                  "steps\n",
                  static_cast<long long>(flags.powersgd_rank),
                  static_cast<long long>(flags.powersgd_start_iter));
    } else if (flags.comm_hook == "localsgd") {
      std::printf("mnist_train: communication hook localsgd: gradients over every rank for the first %lld "
                  "steps, then within groups; parameters averaged over every rank each %lld steps\n",
                  static_cast<long long>(flags.local_sgd_start_iter), static_cast<long long>(flags.local_sgd_period));
    } else if (flags.comm_hook != "allreduce") {
      std::printf("mnist_train: communication hook %s\n", flags.comm_hook.c_str());
    }
  }
  if (completed_epochs > 0 || completed_steps > 0) {
    // Every rank reads the files onto its own device, and mid-epoch the
    // sampler's position: the next batches are those an uninterrupted run
    // would draw.
    std::string note;
    const std::string tag = mnist::checkpoint_tag(completed_epochs, completed_steps);
    const std::string path = mnist::load_checkpoint(trained, flags.checkpoint_dir, flags.checkpoint_format, tag,
                                                    group->size(), &note);
    if (completed_steps > 0) {
      mnist::load_sampler(sampler, flags.checkpoint_dir, tag);
    }
    if (is_rank0) {
      const std::string steps_done =
          completed_steps > 0 ? " and " + std::to_string(completed_steps) + " steps of the next" : "";
      std::printf("mnist_train: resumed from %s%s: %lld of %lld epochs done%s%s\n", path.c_str(), note.c_str(),
                  static_cast<long long>(completed_epochs), static_cast<long long>(flags.epochs),
                  steps_done.c_str(), completed_epochs >= flags.epochs ? "; nothing left to train" : "");
    }
  }

  // Saves the checkpoint of the position (epochs done, steps of the next)
  // on every rank (a collective: rank 0 writes, or each rank its shard),
  // then, once it is complete, rank 0 names it in `latest` and removes the
  // older ones. The model stays where it is (moving it to the CPU to save,
  // as some PyTorch code does, would take it out of DDP's hands). Returns
  // the path the log names.
  const auto save = [&](int64_t done_epochs, int64_t done_steps) {
    const std::string tag = mnist::checkpoint_tag(done_epochs, done_steps);
    const std::string path = mnist::save_checkpoint(trained, flags.checkpoint_dir, flags.checkpoint_format, tag);
    if (is_rank0) {
      if (done_steps > 0) {
        mnist::save_sampler(sampler, flags.checkpoint_dir, tag); // every rank's position is the same
      }
      mnist::write_sidecar(flags.checkpoint_dir, mnist::Sidecar{done_epochs, done_steps, group->size(),
                                                                flags.batch_size, flags.seed, flags.checkpoint_format});
      mnist::remove_other_checkpoints(flags.checkpoint_dir, tag);
    }
    return path;
  };

  const auto on_device = torch::TensorOptions().dtype(torch::kDouble).device(device);
  for (int64_t epoch = completed_epochs + 1; epoch <= flags.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    sampler.set_epoch(epoch - 1); // on every rank, before the pass
    const std::string label =
        "epoch " + std::to_string(epoch) + "/" + std::to_string(flags.epochs);
    mnist::Progress progress(label, steps);

    // The loss is summed on the device and read only when shown: reading it
    // every step would wait for the GPU at every step.
    auto loss_sum = torch::zeros({}, on_device);
    int64_t samples = 0;
    // A run resumed mid-epoch goes on from the step its checkpoint was taken
    // at; the epoch's loss and throughput then cover the steps after it.
    int64_t step = epoch == completed_epochs + 1 ? completed_steps : 0;
    for (auto& batch : *loader) {
      auto x = batch.data.to(device, /*non_blocking=*/true);
      auto y = batch.target.to(device, /*non_blocking=*/true);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(forward(x), y);
      loss.backward(); // averages the gradients across ranks
      {
        // A span on the timeline's optimizer track (ddprun --trace DIR);
        // nothing when the timeline is off.
        ddp::TimelineScope traced("optimizer step", "optimizer");
        optimizer.step();
      }

      const int64_t n = x.size(0);
      loss_sum += loss.detach().to(torch::kDouble) * static_cast<double>(n);
      samples += n;
      ++step;
      if (flags.checkpoint_every > 0 && step % flags.checkpoint_every == 0 && step < steps) {
        save(epoch - 1, step);
      }
      if (test_crash && test_crash->rank == world.rank && test_crash->epoch == epoch &&
          test_crash->step == step) {
        std::printf("mnist_train: rank %d kills itself after epoch %lld step %lld "
                    "(MNIST_TRAIN_TEST_CRASH)\n",
                    world.rank, static_cast<long long>(epoch), static_cast<long long>(step));
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      if (is_rank0 && progress.due(step)) {
        // Rank 0's own loss: averaging it across ranks at every step would
        // cost a collective per step; the epoch's line below has the mean.
        progress.update(step, samples * group->size(), loss_sum.item<double>() / samples);
      }
    }
    if (is_rank0) {
      progress.finish();
    }
    const double train_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();

    // The epoch's mean loss over every rank's examples: one collective.
    auto totals = torch::stack({loss_sum, torch::full({}, static_cast<double>(samples), on_device)});
    group->allreduce(totals)->wait();
    const double train_loss = totals[0].item<double>() / totals[1].item<double>();
    const double samples_per_s = totals[1].item<double>() / train_seconds;

    if (hooks) {
      hooks->end_of_epoch(wrapper->parameters()); // local SGD: one model again
    }
    // DDP: the inner module, with no collective per batch; FSDP: the model.
    const Accuracy accuracy =
        fsdp ? evaluate(**fsdp, forward, true, split->test, *group, device, flags.batch_size)
             : evaluate(*(*model)->module(),
                        [&](const torch::Tensor& x) { return (*model)->module_as<mnist::ConvNetImpl>()->forward(x); },
                        false, split->test, *group, device, flags.batch_size);
    const double accuracy_value =
        accuracy.total > 0 ? static_cast<double>(accuracy.correct) / accuracy.total : 0.0;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();

    if (is_rank0 && !flags.csv.empty()) {
      append_csv(flags.csv, epoch, train_loss, accuracy_value, samples_per_s, seconds);
    }
    std::string saved;
    if (!flags.checkpoint_dir.empty()) {
      saved = "; saved " + save(epoch, 0);
    }
    if (is_rank0) {
      std::printf("%s: train loss %.4f, test accuracy %.4f (%lld/%lld), %.0f samples/s, %s%s\n",
                  label.c_str(), train_loss, accuracy_value,
                  static_cast<long long>(accuracy.correct), static_cast<long long>(accuracy.total),
                  samples_per_s, mnist::format_duration(seconds).c_str(), saved.c_str());
    }
    if (epoch == flags.stop_after_epoch) {
      if (is_rank0) {
        std::printf("mnist_train: stopping after epoch %lld as asked (--stop-after-epoch); run "
                    "again with --resume to continue\n",
                    static_cast<long long>(epoch));
      }
      ddp::destroy_process_group();
      return 0;
    }
  }

  if (hooks && is_rank0) {
    hooks->report(*wrapper);
  }

  // A last check that DDP kept the replicas equal, and a checksum by which
  // two runs can be compared. Under FSDP each rank holds other shards: the
  // checksum is of the full parameters, gathered (a collective).
  if (fsdp) {
    auto full = (*fsdp)->full_state_dict();
    torch::nn::Module parameters;
    for (const auto& name : ddp::module_parameter_names(*(*fsdp)->module())) {
      parameters.register_parameter(std::to_string(parameters.parameters().size()), full[name]);
    }
    if (is_rank0) {
      int64_t values = 0;
      const std::string checksum = parameter_checksum(parameters, &values);
      std::printf("final parameters: checksum %s (%lld values); sharded over %s\n", checksum.c_str(),
                  static_cast<long long>(values), ranks(group->size()).c_str());
    }
    ddp::destroy_process_group();
    return 0;
  }
  const double difference = (*model)->max_parameter_difference_across_ranks();
  if (is_rank0) {
    int64_t values = 0;
    const std::string checksum = parameter_checksum(*(*model)->module(), &values);
    std::printf("final parameters: checksum %s (%lld values); they %s across %s (max "
                "difference %g)\n",
                checksum.c_str(), static_cast<long long>(values),
                difference == 0.0 ? "agree" : "DIFFER", ranks(group->size()).c_str(), difference);
  }
  ddp::destroy_process_group();
  return difference == 0.0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  // Under a launcher stdout is a pipe: print each line as it is written.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    Flags flags = mnist::parse_flags(argc, argv);
    if (flags.help) {
      std::fputs(mnist::usage(), stdout);
      return 0;
    }
    const int64_t restart_count = restart_count_from_env();
    if (restart_count > 0 && !flags.checkpoint_dir.empty()) {
      flags.resume = true; // see "Restarts" above
    }
    ddp::WorldInfo world;
    try {
      world = ddp::world_info_from_env();
    } catch (const c10::Error& e) {
      throw FlagError(ddp::error_message(e)); // a malformed RANK, WORLD_SIZE, ...
    }
    const torch::Device device = pick_device(world);
    return train(flags, world, device, restart_count);
  } catch (const FlagError& e) {
    std::fprintf(stderr, "mnist_train: %s\nRun 'mnist_train --help' for the flags.\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "mnist_train: %s\n", ddp::error_message(e).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_train: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
