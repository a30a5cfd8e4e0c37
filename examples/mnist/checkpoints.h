#pragma once

// mnist_train's checkpoints: one per epoch in --checkpoint-dir, in the
// format --checkpoint-format names, and the sidecar file `latest` that says
// which is the newest complete one. See Note [Checkpoint directory] in
// checkpoints.cpp.

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include <ddp/ddp.h>

namespace mnist {

/// What `latest` records of the run that wrote the newest checkpoint.
struct Sidecar {
  int64_t completed_epochs = 0;
  /// Steps done of epoch completed_epochs + 1 (--checkpoint-every); 0 at the
  /// end of an epoch.
  int64_t completed_steps = 0;
  int64_t world_size = 0;
  int64_t batch_size = 0;
  uint64_t seed = 0;
  std::string format = "ddp";
};

/// The model being trained: a DDP model or an FSDP one, and its optimizer.
struct Trained {
  ddp::DistributedDataParallel* ddp_model = nullptr;
  ddp::FullyShardedDataParallel* fsdp_model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
};

/// mkdir -p. (Not std::filesystem: PyPI's LibTorch exports a copy of it that
/// shadows libstdc++'s, PyTorch issue 133437; plain POSIX calls avoid it.)
void make_directories(const std::string& dir);

/// Writes `text` to `path` through a temporary file and a rename.
void write_atomically(const std::string& path, const std::string& text);

void write_sidecar(const std::string& dir, const Sidecar& sidecar);
/// The sidecar of `dir`, or nullopt when there is none yet.
std::optional<Sidecar> read_sidecar(const std::string& dir);

/// The stem of a checkpoint's files: "epoch-2" after 2 whole epochs,
/// "epoch-3-step-10" after 10 steps of epoch 3.
std::string checkpoint_tag(int64_t completed_epochs, int64_t completed_steps);

/// Saves the checkpoint `tag` in `format` (a collective); returns the path
/// it names in the log.
std::string save_checkpoint(const Trained& trained, const std::string& dir, const std::string& format,
                            const std::string& tag);

/// Loads the checkpoint `tag` of `format` on every rank; returns the path it
/// read, and in `note` what the load could not carry over.
std::string load_checkpoint(const Trained& trained, const std::string& dir, const std::string& format,
                            const std::string& tag, int world_size, std::string* note);

/// The sampler's epoch and position in `tag`.sampler.pt: saved by one rank
/// (every rank's position is the same), loaded by each.
void save_sampler(const ddp::DistributedSampler& sampler, const std::string& dir, const std::string& tag);
void load_sampler(ddp::DistributedSampler& sampler, const std::string& dir, const std::string& tag);

/// Removes the checkpoint files of `dir` but those of `keep`.
void remove_other_checkpoints(const std::string& dir, const std::string& keep);

} // namespace mnist
