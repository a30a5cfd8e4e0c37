#pragma once

// The command line of mnist_train.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace mnist {

/// What the command line asks for. Defaults train the synthetic set for
/// three quick epochs.
struct Flags {
  /// Epochs to train in all (a resumed run counts those already done).
  int64_t epochs = 3;
  /// Examples per step on each rank; a step of N ranks sees N times as many.
  int64_t batch_size = 64;
  /// Learning rate of SGD.
  double lr = 0.01;
  /// Momentum of SGD.
  double momentum = 0.9;
  /// Directory of MNIST's IDX files; empty: the synthetic set.
  std::string data;
  /// Training examples: of the synthetic set (default 6000), or the first
  /// ones of --data (default all).
  std::optional<int64_t> train_size;
  /// Test examples, as train_size (default 1000 synthetic, all of --data).
  std::optional<int64_t> test_size;
  /// Seed of the synthetic set, of the initial parameters and of the
  /// sampler's shuffle.
  uint64_t seed = 1;
  /// Where checkpoints go; empty: none are written.
  std::string checkpoint_dir;
  /// The checkpoints' format: "ddp" (ddp::save_checkpoint), "dcp" (a
  /// torch.distributed.checkpoint directory: any world size, optimizer state
  /// included), "torch" (torch.save-format state dicts of the model and the
  /// optimizer) or "safetensors" (the model; the optimizer's state in
  /// torch.save's format beside it). See checkpoints.cpp.
  std::string checkpoint_format = "ddp";
  /// Also save a checkpoint every this many steps within an epoch (0: at
  /// the ends of epochs only), with the sampler's position, so that a
  /// resumed run goes on from that step exactly.
  int64_t checkpoint_every = 0;
  /// Continue from the newest checkpoint in checkpoint_dir.
  bool resume = false;
  /// Where rank 0 writes one row of metrics per epoch; empty: nowhere.
  std::string csv;
  /// Stop right after saving this epoch's checkpoint (0: never), as if the
  /// job had been killed there.
  int64_t stop_after_epoch = 0;
  /// How DDP reduces the gradients: "allreduce" (the default hook), "fp16",
  /// "bf16" (compressed to 16 bits), "powersgd" (PowerSGD) or "localsgd"
  /// (post-local SGD, with a PeriodicModelAverager after each step).
  std::string comm_hook = "allreduce";
  /// DDP's bucket size in MiB (bucket_cap_mb; the first bucket gets
  /// min(1, this), PyTorch's 1 MiB first bucket when larger).
  double bucket_cap_mb = 25.0;
  /// PowerSGD's matrix_approximation_rank.
  int64_t powersgd_rank = 1;
  /// PowerSGD's start_powerSGD_iter: plain steps before compression starts.
  int64_t powersgd_start_iter = 10;
  /// Local SGD: the averager's period, the global steps first (the hook's
  /// start_localSGD_iter and the averager's warmup), and the size of the
  /// groups that average gradients in between (0: the ranks of a node).
  int64_t local_sgd_period = 4;
  int64_t local_sgd_start_iter = 10;
  int64_t local_sgd_group_size = 0;
  /// Where SGD's state (its momentum buffers) lives: "none" (every rank
  /// keeps all of it), "zero1" (ddp::optim::ZeroRedundancyOptimizer: each
  /// rank keeps its shard) or "zero2" (the gradients sharded too, the steps
  /// run during backward).
  std::string optimizer_sharding = "none";
  /// Train under ddp::FullyShardedDataParallel instead of DDP: "" (no),
  /// "full" (kFullShard) or "grad-op" (kShardGradOp); each layer a unit.
  std::string fsdp;
  /// Print the usage and exit.
  bool help = false;
};

/// A bad command line; `what()` says which flag and value.
struct FlagError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses `--flag value` and `--flag=value`. Throws FlagError.
Flags parse_flags(int argc, char** argv);

/// The usage text, one flag a line.
const char* usage();

} // namespace mnist
