#pragma once

/// `DistributedSampler`: splits a dataset's indices across the replicas of a
/// data-parallel job, yielding exactly what PyTorch's
/// `torch.utils.data.DistributedSampler` yields.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/arg.h>
#include <torch/data/samplers/base.h>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
} // namespace torch::serialize

namespace ddp {

/// Options of `DistributedSampler`. `num_replicas` and `rank` are optional:
/// left unset (std::nullopt) they are read from the default process group
/// when the sampler is constructed, and with no group initialized they are 1
/// and 0, as for a world of size 1.
/// Example:
/// `ddp::DistributedSampler(dataset.size().value(), ddp::DistributedSamplerOptions().seed(42).drop_last(true))`
struct DistributedSamplerOptions {
  /// How many replicas (processes) share the dataset. Default: std::nullopt,
  /// meaning `ddp::default_process_group()->size()`, or 1 when
  /// `ddp::is_initialized()` is false.
  TORCH_ARG(std::optional<int>, num_replicas) = std::nullopt;
  /// This replica's rank in [0, num_replicas). Default: std::nullopt, meaning
  /// `ddp::default_process_group()->rank()`, or 0 when `ddp::is_initialized()`
  /// is false.
  TORCH_ARG(std::optional<int>, rank) = std::nullopt;
  /// Whether each epoch visits the dataset in a fresh random order, drawn
  /// from a generator seeded with `seed + epoch`. Default: true.
  TORCH_ARG(bool, shuffle) = true;
  /// Seed of the shuffle; must be the same on every replica. Default: 0.
  TORCH_ARG(int64_t, seed) = 0;
  /// Whether to drop the tail of the (shuffled) indices so that the dataset
  /// splits evenly, instead of padding it by repeating indices from the
  /// head. Default: false.
  TORCH_ARG(bool, drop_last) = false;
};

/// A LibTorch sampler that gives each replica of a data-parallel job its own
/// share of a dataset's indices: `num_samples()` indices per replica per
/// epoch, index for index those of PyTorch's
/// `torch.utils.data.DistributedSampler(dataset, num_replicas, rank, shuffle,
/// seed, drop_last)` after `set_epoch(epoch)` (see docs/sampler.md).
///
/// Use it as the sampler of `torch::data::make_data_loader`, and do not
/// shuffle in the data loader: the sampler owns the shuffling. Call
/// `set_epoch(epoch)` before each epoch, or every epoch sees the same order.
///
/// A pass over the data starts at `reset()` (the data loader calls it at each
/// `begin()`) and uses the epoch set when its first batch is drawn; a later
/// `set_epoch` applies to the next pass, as in PyTorch.
///
/// Copies share one state (See Note [Sampler copies share state]): the copy
/// that `make_data_loader` takes by value sees `set_epoch` called on yours,
/// and `save` on yours records the data loader's position.
///
/// Thread-safety: every method may be called from any thread; the shared
/// state is guarded by a mutex.
class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  /// A sampler over the indices [0, dataset_size). Throws `c10::Error` when
  /// `num_replicas < 1` or `rank` is outside [0, num_replicas).
  explicit DistributedSampler(
      size_t dataset_size,
      const DistributedSamplerOptions& options = {});

  /// Copies share the state of `other` (there is no separate move: a
  /// moved-from sampler stays usable).
  DistributedSampler(const DistributedSampler& other) = default;
  DistributedSampler& operator=(const DistributedSampler& other) = default;
  ~DistributedSampler() override;

  /// Sets the epoch of the next pass. With `shuffle`, each epoch has its own
  /// order; every replica must use the same epoch.
  void set_epoch(int64_t epoch);
  /// The epoch last given to `set_epoch` (0 at first).
  int64_t epoch() const;

  /// Indices per replica per epoch: ceil(dataset_size / num_replicas), or
  /// floor(...) with `drop_last` (`len(sampler)` in PyTorch).
  size_t num_samples() const;
  /// num_samples() * num_replicas(): the padded or truncated length.
  size_t total_size() const;
  /// The size of the dataset being sampled.
  size_t dataset_size() const;
  /// The number of replicas, resolved at construction.
  int num_replicas() const;
  /// This replica's rank, resolved at construction.
  int rank() const;
  /// The options, with `num_replicas` and `rank` resolved.
  DistributedSamplerOptions options() const;

  /// This replica's indices for epoch `epoch()`, in order: what
  /// `list(sampler)` gives in PyTorch. Does not move the sampler.
  std::vector<size_t> epoch_indices() const;
  /// How many indices the current pass has yielded so far.
  size_t index() const;

  /// Ends the current pass; the next `next()` starts a new one with epoch
  /// `epoch()`. `new_size` replaces the dataset size. After `load()`, the
  /// first reset keeps the loaded position instead, so that a data loader
  /// built from a loaded sampler resumes mid-epoch, unless `set_epoch` named
  /// another epoch or `new_size` another size in between.
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;

  /// Up to `batch_size` further indices of this pass, or nullopt once the
  /// pass has yielded all `num_samples()`. Throws if `batch_size` is 0.
  /// Logs a warning, once per sampler, when a shuffled pass repeats the epoch
  /// of the previous pass (`set_epoch` was not called in between).
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;

  /// Writes the epoch, the position in the current pass, and what identifies
  /// its order (dataset size, num_replicas, shuffle, seed, drop_last).
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Restores the epoch and the position saved by `save`. The saved rank is
  /// not restored: a state saved on one rank resumes every rank at the same
  /// position in its own share. Throws `c10::Error` naming both values when
  /// the dataset size, num_replicas, shuffle, seed or drop_last differ from
  /// this sampler's.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State;
  // Never null; shared by copies. See Note [Sampler copies share state].
  std::shared_ptr<State> state_;
};

} // namespace ddp
