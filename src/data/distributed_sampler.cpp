// DistributedSampler: each replica's share of a dataset, index for index as
// PyTorch's torch.utils.data.DistributedSampler.
//
// How it works. An epoch has one global `order` of the dataset_size indices:
// a permutation drawn by ATen's randperm from a CPU generator seeded with
// seed + epoch when shuffling (the same generator and kernel that Python's
// torch.randperm(n, generator=g) runs), else 0, 1, ..., dataset_size - 1.
// The order is then brought to total_size = num_samples * num_replicas
// entries: without drop_last by appending its own head as often as needed
// (num_samples = ceil(dataset_size / num_replicas)), with drop_last by
// cutting its tail (num_samples = floor(dataset_size / num_replicas)). Either
// way entry i of the result is order[i % dataset_size]. Replica `rank` takes
// the entries rank, rank + num_replicas, rank + 2 * num_replicas, ...
//
// A pass is one walk through a replica's share: it starts at the first
// next() after reset(), fixing its epoch (pass_epoch) and materializing its
// indices (pass_indices); `position` counts the indices it has yielded.
//
// Note [Sampler copies share state]
// torch::data::make_data_loader takes its sampler by value and offers no way
// back to it, while PyTorch's loop calls sampler.set_epoch(epoch) on the
// sampler the DataLoader holds. So that the same loop works here, copies of a
// DistributedSampler share one State (as Python references share one
// object): the user keeps a copy, passes another to the data loader, and
// set_epoch/save on the kept copy act on the loader's.

#include <ddp/data/distributed_sampler.h>

#include "data/default_placement.h"
#include "internal/check.h"
#include "internal/logging.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randperm.h>
#include <c10/core/ScalarType.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>

namespace ddp {
namespace {

// Bumped when the archive layout of save() changes.
constexpr int64_t kArchiveVersion = 1;

// The fields that fix a replica's share of each epoch.
struct Layout {
  size_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  int64_t seed = 0;
  bool drop_last = false;

  size_t num_samples() const {
    const auto replicas = static_cast<size_t>(num_replicas);
    if (drop_last) {
      return dataset_size / replicas;
    }
    return dataset_size / replicas + (dataset_size % replicas != 0 ? 1 : 0);
  }
};

void check_dataset_size(size_t dataset_size) {
  DDP_CHECK(
      dataset_size <= static_cast<size_t>(std::numeric_limits<int64_t>::max()),
      "DistributedSampler: dataset size ", dataset_size,
      " is too large (expected at most ",
      std::numeric_limits<int64_t>::max(), ")");
}

// This replica's indices for `epoch`; see the narrative at the top.
std::vector<size_t> share_of_epoch(const Layout& layout, int64_t epoch) {
  const size_t num_samples = layout.num_samples();
  const auto replicas = static_cast<size_t>(layout.num_replicas);
  const auto rank = static_cast<size_t>(layout.rank);
  std::vector<size_t> share;
  share.reserve(num_samples);
  if (num_samples == 0) {
    return share;
  }
  const size_t n = layout.dataset_size;
  if (!layout.shuffle) {
    for (size_t k = 0; k < num_samples; ++k) {
      share.push_back((rank + k * replicas) % n);
    }
    return share;
  }
  // Python adds seed and epoch as unbounded ints and hands the sum to
  // manual_seed, which takes its 64-bit two's complement pattern; unsigned
  // wrap-around gives the same bits whenever Python accepts the sum.
  const uint64_t generator_seed =
      static_cast<uint64_t>(layout.seed) + static_cast<uint64_t>(epoch);
  at::Generator generator =
      at::make_generator<at::CPUGeneratorImpl>(generator_seed);
  const at::Tensor order = at::randperm(
      static_cast<int64_t>(n), generator, at::TensorOptions(at::kLong));
  const int64_t* order_data = order.data_ptr<int64_t>();
  for (size_t k = 0; k < num_samples; ++k) {
    share.push_back(static_cast<size_t>(order_data[(rank + k * replicas) % n]));
  }
  return share;
}

std::string bool_name(bool value) {
  return value ? "true" : "false";
}

c10::IValue read_entry(
    torch::serialize::InputArchive& archive,
    const std::string& key) {
  c10::IValue value;
  DDP_CHECK(
      archive.try_read(key, value),
      "DistributedSampler::load: the archive has no '", key,
      "' entry; was it written by DistributedSampler::save?");
  return value;
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  const c10::IValue value = read_entry(archive, key);
  DDP_CHECK(
      value.isInt(), "DistributedSampler::load: entry '", key,
      "' should be an int, got ", value.tagKind());
  return value.toInt();
}

bool read_bool(torch::serialize::InputArchive& archive, const std::string& key) {
  const c10::IValue value = read_entry(archive, key);
  DDP_CHECK(
      value.isBool(), "DistributedSampler::load: entry '", key,
      "' should be a bool, got ", value.tagKind());
  return value.toBool();
}

} // namespace

struct DistributedSampler::State {
  explicit State(const Layout& layout_in) : layout(layout_in) {}

  // Starts a pass if none is in progress; caller holds `mutex`.
  void start_pass_if_needed() {
    if (pass_epoch.has_value()) {
      return;
    }
    const bool yields = layout.num_samples() > 0;
    if (layout.shuffle && yields && last_pass_epoch == epoch &&
        !warned_same_epoch) {
      warned_same_epoch = true;
      internal::log_warning(c10::str(
          "DistributedSampler: a new pass over the data started with epoch ",
          epoch, ", the same epoch as the previous pass, so it sees the same "
          "shuffled order. Call set_epoch(epoch) before each epoch (as with "
          "PyTorch's DistributedSampler) to shuffle every epoch differently. "
          "This warning is shown once per sampler."));
    }
    pass_epoch = epoch;
    pass_indices = share_of_epoch(layout, epoch);
    position = 0;
    if (yields) {
      last_pass_epoch = epoch;
    }
  }

  // Ends the current pass; caller holds `mutex`.
  void end_pass() {
    pass_epoch.reset();
    pass_indices.clear();
    pass_indices.shrink_to_fit();
    position = 0;
  }

  mutable std::mutex mutex;
  // All of the following are guarded by `mutex`.
  Layout layout;
  // The epoch the next pass uses.
  int64_t epoch = 0;
  // The epoch of the pass in progress; nullopt between passes.
  std::optional<int64_t> pass_epoch;
  // This replica's indices in the pass in progress.
  std::vector<size_t> pass_indices;
  // How many of pass_indices have been yielded.
  size_t position = 0;
  // The epoch of the last pass that had indices to yield, for the warning.
  std::optional<int64_t> last_pass_epoch;
  bool warned_same_epoch = false;
  // Set by load(): the next reset() keeps the loaded pass.
  bool resume_pending = false;
};

DistributedSampler::DistributedSampler(
    size_t dataset_size,
    const DistributedSamplerOptions& options) {
  check_dataset_size(dataset_size);
  Layout layout;
  layout.dataset_size = dataset_size;
  layout.shuffle = options.shuffle();
  layout.seed = options.seed();
  layout.drop_last = options.drop_last();

  const bool from_placement =
      !options.num_replicas().has_value() || !options.rank().has_value();
  internal::DefaultPlacement placement;
  if (from_placement) {
    placement = internal::default_placement();
  }
  layout.num_replicas = options.num_replicas().value_or(placement.num_replicas);
  layout.rank = options.rank().value_or(placement.rank);

  std::string origin;
  if (from_placement) {
    origin = c10::str(
        "; ",
        !options.num_replicas().has_value() && !options.rank().has_value()
            ? "num_replicas and rank"
            : (options.num_replicas().has_value() ? "rank" : "num_replicas"),
        placement.from_process_group
            ? " came from the default process group"
            : " defaulted to a world of size 1, as no process group is "
              "initialized");
  }
  DDP_CHECK(
      layout.num_replicas >= 1,
      "DistributedSampler: num_replicas must be at least 1 (got ",
      layout.num_replicas, ")");
  DDP_CHECK(
      layout.rank >= 0 && layout.rank < layout.num_replicas,
      "DistributedSampler: rank ", layout.rank,
      " is out of range for num_replicas ", layout.num_replicas,
      " (expected 0 <= rank < num_replicas", origin, ")");
  state_ = std::make_shared<State>(layout);
}

DistributedSampler::~DistributedSampler() = default;

void DistributedSampler::set_epoch(int64_t epoch) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->epoch = epoch;
  if (state_->resume_pending && state_->pass_epoch != epoch) {
    // The caller moved on from the loaded epoch: start the new one afresh.
    state_->resume_pending = false;
  }
}

int64_t DistributedSampler::epoch() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->epoch;
}

size_t DistributedSampler::num_samples() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->layout.num_samples();
}

size_t DistributedSampler::total_size() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->layout.num_samples() *
      static_cast<size_t>(state_->layout.num_replicas);
}

size_t DistributedSampler::dataset_size() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->layout.dataset_size;
}

int DistributedSampler::num_replicas() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->layout.num_replicas;
}

int DistributedSampler::rank() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->layout.rank;
}

DistributedSamplerOptions DistributedSampler::options() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const Layout& layout = state_->layout;
  return DistributedSamplerOptions()
      .num_replicas(layout.num_replicas)
      .rank(layout.rank)
      .shuffle(layout.shuffle)
      .seed(layout.seed)
      .drop_last(layout.drop_last);
}

std::vector<size_t> DistributedSampler::epoch_indices() const {
  Layout layout;
  int64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    layout = state_->layout;
    epoch = state_->epoch;
  }
  return share_of_epoch(layout, epoch);
}

size_t DistributedSampler::index() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->position;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& state = *state_;
  if (new_size.has_value() && *new_size != state.layout.dataset_size) {
    check_dataset_size(*new_size);
    state.layout.dataset_size = *new_size;
    state.resume_pending = false;
    state.end_pass();
    return;
  }
  if (state.resume_pending) {
    state.resume_pending = false;
    return;
  }
  state.end_pass();
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  DDP_CHECK(
      batch_size > 0,
      "DistributedSampler::next: batch_size must be at least 1 (got 0)");
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& state = *state_;
  state.resume_pending = false;
  state.start_pass_if_needed();
  if (state.position >= state.pass_indices.size()) {
    return c10::nullopt;
  }
  const size_t count =
      std::min(batch_size, state.pass_indices.size() - state.position);
  const auto first =
      state.pass_indices.begin() + static_cast<std::ptrdiff_t>(state.position);
  std::vector<size_t> batch(first, first + static_cast<std::ptrdiff_t>(count));
  state.position += count;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const State& state = *state_;
  const Layout& layout = state.layout;
  archive.write("version", c10::IValue(kArchiveVersion));
  archive.write(
      "dataset_size", c10::IValue(static_cast<int64_t>(layout.dataset_size)));
  archive.write(
      "num_replicas", c10::IValue(static_cast<int64_t>(layout.num_replicas)));
  // Informational: load() keeps the loading sampler's own rank.
  archive.write("rank", c10::IValue(static_cast<int64_t>(layout.rank)));
  archive.write("shuffle", c10::IValue(layout.shuffle));
  archive.write("seed", c10::IValue(layout.seed));
  archive.write("drop_last", c10::IValue(layout.drop_last));
  archive.write("epoch", c10::IValue(state.epoch));
  archive.write("in_pass", c10::IValue(state.pass_epoch.has_value()));
  archive.write("pass_epoch", c10::IValue(state.pass_epoch.value_or(0)));
  archive.write("position", c10::IValue(static_cast<int64_t>(state.position)));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  const int64_t version = read_int(archive, "version");
  DDP_CHECK(
      version == kArchiveVersion,
      "DistributedSampler::load: archive version ", version,
      " is not supported (expected ", kArchiveVersion, ")");
  const int64_t dataset_size = read_int(archive, "dataset_size");
  const int64_t num_replicas = read_int(archive, "num_replicas");
  const bool shuffle = read_bool(archive, "shuffle");
  const int64_t seed = read_int(archive, "seed");
  const bool drop_last = read_bool(archive, "drop_last");
  const int64_t epoch = read_int(archive, "epoch");
  const bool in_pass = read_bool(archive, "in_pass");
  const int64_t pass_epoch = read_int(archive, "pass_epoch");
  const int64_t position = read_int(archive, "position");

  std::lock_guard<std::mutex> lock(state_->mutex);
  State& state = *state_;
  const Layout& layout = state.layout;
  const char* const hint =
      "; construct the sampler with the dataset and options it was saved with";
  DDP_CHECK(
      dataset_size == static_cast<int64_t>(layout.dataset_size),
      "DistributedSampler::load: the state was saved for dataset size ",
      dataset_size, ", but this sampler has dataset size ",
      layout.dataset_size, hint);
  DDP_CHECK(
      num_replicas == layout.num_replicas,
      "DistributedSampler::load: the state was saved with num_replicas ",
      num_replicas, ", but this sampler has num_replicas ",
      layout.num_replicas, hint);
  DDP_CHECK(
      shuffle == layout.shuffle,
      "DistributedSampler::load: the state was saved with shuffle=",
      bool_name(shuffle), ", but this sampler has shuffle=",
      bool_name(layout.shuffle), hint);
  DDP_CHECK(
      seed == layout.seed,
      "DistributedSampler::load: the state was saved with seed ", seed,
      ", but this sampler has seed ", layout.seed, hint);
  DDP_CHECK(
      drop_last == layout.drop_last,
      "DistributedSampler::load: the state was saved with drop_last=",
      bool_name(drop_last), ", but this sampler has drop_last=",
      bool_name(layout.drop_last), hint);
  const size_t num_samples = layout.num_samples();
  DDP_CHECK(
      position >= 0 && static_cast<size_t>(position) <= num_samples,
      "DistributedSampler::load: saved position ", position,
      " is out of range for num_samples ", num_samples,
      " (expected 0 <= position <= num_samples); the archive is corrupt");

  state.epoch = epoch;
  state.end_pass();
  state.resume_pending = false;
  if (in_pass) {
    state.pass_epoch = pass_epoch;
    state.pass_indices = share_of_epoch(layout, pass_epoch);
    state.position = static_cast<size_t>(position);
    state.resume_pending = true;
    if (num_samples > 0) {
      state.last_pass_epoch = pass_epoch;
    }
  }
}

} // namespace ddp
