// PowerSGDState: what both PowerSGD hooks share (the options' checks, the
// random seeds, the collective order, the memories) and what checkpoints
// keep of it.
//
// Note [PowerSGD memories across layouts]
// The error feedback and the warm-start Q of a bucket belong to its
// parameters, in the bucket's order: keyed by bucket index alone (as
// PyTorch keys them), a memory would be applied to other gradients whenever
// the buckets change, which is what happens to a run resumed from a
// checkpoint (a new DistributedDataParallel starts with its first-iteration
// buckets and rebuilds them after it). So each memory records the names of
// its bucket's parameters and which hook made it; `memory_for` gives a
// bucket its memory only when both match, takes a memory that load_state
// restored when one matches, and otherwise starts afresh (zero error, a new
// random Q), with a warning when that drops a memory. A resumed run whose
// buckets hold the same parameters as those of the run that saved (the
// usual case: the buckets are rebuilt in the order the gradients become
// ready, which the same model repeats) continues exactly as the
// uninterrupted one: tests/nn/powersgd_resume_main.cpp checks it.

#include "comm_hooks/powersgd_internal.h"

#include <algorithm>
#include <exception>
#include <sstream>
#include <utility>

#include "comm/objects/object_frame.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::comm_hooks {

namespace internal {

void ChainedWork::set_inner(std::shared_ptr<Work> inner) {
  std::lock_guard<std::mutex> lock(inner_mutex_);
  inner_ = std::move(inner);
}

void ChainedWork::wait(std::chrono::milliseconds timeout) {
  std::shared_ptr<Work> inner;
  {
    std::lock_guard<std::mutex> lock(inner_mutex_);
    inner = inner_;
  }
  if (inner) {
    try {
      inner->wait(timeout);
    } catch (...) {
      // A timeout of this wait leaves the operation running: only a
      // finished failure completes this Work.
      if (inner->is_completed() && !is_completed()) {
        set_error(std::current_exception());
      }
      throw;
    }
  }
  Work::wait(timeout);
}

void orthogonalize(const at::Tensor& matrices, double epsilon) {
  const int64_t columns = matrices.size(2);
  const bool half = matrices.scalar_type() == at::kHalf || matrices.scalar_type() == at::kBFloat16;
  if (columns > 2 && !half) {
    matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
    return;
  }
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    at::Tensor norm = at::norm(column, 2, {1}, /*keepdim=*/true);
    if (epsilon != 0) {
      norm.add_(epsilon);
    }
    column.div_(norm);
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, {1}, /*keepdim=*/true) * column);
    }
  }
}

void send_q(ProcessGroup& group, const std::shared_ptr<ChainedWork>& result, const at::Tensor& q,
            std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> decompress) {
  std::shared_ptr<Work> second;
  try {
    second = group.size() == 1 ? Work::completed({q}) : group.allreduce(q);
  } catch (...) {
    result->set_error(std::current_exception());
    return;
  }
  result->set_inner(second->then(std::move(decompress)));
}

std::string work_name(const ProcessGroup& group, const char* hook, size_t bucket_index) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] ", hook, " bucket ", bucket_index);
}

} // namespace internal

PowerSGDState::PowerSGDState(PowerSGDOptions options)
    : options_(std::move(options)), seed_rng_(options_.random_seed()) {
  DDP_CHECK(options_.matrix_approximation_rank() >= 1,
            "PowerSGDState: matrix_approximation_rank must be at least 1 (got ",
            options_.matrix_approximation_rank(), ")");
  DDP_CHECK(!(options_.use_error_feedback() || options_.warm_start()) ||
                options_.start_powerSGD_iter() > 1,
            "PowerSGDState: start_powerSGD_iter must be at least 2 with use_error_feedback or "
            "warm_start (got ",
            options_.start_powerSGD_iter(),
            "): DDP rebuilds its buckets after the first iteration, and the error and Q memories "
            "are kept per bucket");
  DDP_CHECK(options_.start_powerSGD_iter() >= 0,
            "PowerSGDState: start_powerSGD_iter must not be negative (got ",
            options_.start_powerSGD_iter(), ")");
  DDP_CHECK(options_.min_compression_rate() >= 0,
            "PowerSGDState: min_compression_rate must not be negative (got ",
            options_.min_compression_rate(), ")");
  DDP_CHECK(options_.orthogonalization_epsilon() >= 0,
            "PowerSGDState: orthogonalization_epsilon must not be negative (got ",
            options_.orthogonalization_epsilon(), ")");
}

PowerSGDState::~PowerSGDState() = default;

PowerSGDCompressionStats PowerSGDState::compression_stats() const {
  PowerSGDCompressionStats stats;
  stats.numel_before = numel_before_.load();
  stats.numel_after = numel_after_.load();
  if (stats.numel_after > 0) {
    stats.rate = static_cast<double>(stats.numel_before) / static_cast<double>(stats.numel_after);
  }
  return stats;
}

at::Tensor PowerSGDState::error(size_t bucket_index) const {
  auto it = memories_.find(bucket_index);
  return it == memories_.end() ? at::Tensor() : it->second->error;
}

// PyTorch draws each initialisation's torch seed with NumPy's legacy
// RandomState(random_seed).randint(1_000_000_000): MT19937 seeded as
// std::mt19937 is, 32-bit draws masked to 30 bits, values over the bound
// rejected.
uint32_t PowerSGDState::next_seed() {
  constexpr uint32_t kMax = 1'000'000'000 - 1;
  constexpr uint32_t kMask = (1u << 30) - 1;
  uint32_t value = 0;
  do {
    value = static_cast<uint32_t>(seed_rng_()) & kMask;
  } while (value > kMax);
  return value;
}

std::shared_ptr<Work> PowerSGDState::plain_allreduce(ProcessGroup& group, GradBucket& bucket) {
  const at::Tensor& buffer = bucket.buffer();
  bytes_allreduced_ += static_cast<uint64_t>(buffer.nbytes());
  ++allreduce_calls_;
  if (group.size() == 1) {
    return Work::completed({buffer.is_sparse() ? buffer.coalesce() : buffer});
  }
  buffer.div_(group.size());
  return group.allreduce(buffer);
}

std::shared_ptr<Work> PowerSGDState::plain_unless_compressing(ProcessGroup& group, GradBucket& bucket) {
  // PyTorch's PowerSGD takes no sparse gradient; ours averages it plainly.
  if (iteration_.load() >= options_.start_powerSGD_iter() && !bucket.buffer().is_sparse()) {
    return nullptr;
  }
  if (bucket.is_last()) {
    ++iteration_;
  }
  return plain_allreduce(group, bucket);
}

std::shared_ptr<Work> PowerSGDState::launch(ProcessGroup& group, std::unique_ptr<InFlight> current, const char* hook,
                                            bool last) {
  bytes_allreduced_ += static_cast<uint64_t>(current->first.nbytes());
  ++allreduce_calls_;
  current->first_work = group.size() == 1 ? Work::completed({current->first}) : group.allreduce(current->first);
  current->result =
      std::make_shared<internal::ChainedWork>(internal::work_name(group, hook, current->index), group.timeout());
  std::shared_ptr<Work> result = current->result;
  chain(group, std::move(current), last);
  return result;
}

bool PowerSGDState::first_completed(InFlight& bucket) {
  try {
    bucket.first_work->wait();
    return true;
  } catch (...) {
    bucket.result->set_error(std::current_exception());
    return false;
  }
}

std::shared_ptr<PowerSGDState::BucketMemory>& PowerSGDState::memory_for(const GradBucket& bucket,
                                                                         bool batched) {
  auto& memory = memories_[bucket.index()];
  const auto& names = bucket.parameter_names();
  auto fits = [&](const std::shared_ptr<BucketMemory>& m) { return m->names == names && m->batched == batched; };
  if (memory && fits(memory)) {
    return memory;
  }
  const auto restored = std::find_if(restored_.begin(), restored_.end(), fits);
  if (restored != restored_.end()) {
    memory = std::move(*restored);
    restored_.erase(restored);
    // Saved on the CPU; the bucket may live on a GPU.
    const auto options = bucket.buffer().options();
    if (memory->q.defined()) {
      memory->q = memory->q.to(options);
    }
    if (memory->error.defined()) {
      memory->error = memory->error.to(options);
    }
    return memory;
  }
  if (memory || !restored_.empty()) {
    ddp::internal::log_warning(c10::str(
        "PowerSGD: bucket ", bucket.index(), " (", names.size(), " parameters, first '",
        names.empty() ? std::string() : names.front(), "') ",
        memory ? "holds other parameters than when its memory was made"
               : "matches none of the buckets of the loaded state",
        ": its error feedback and warm-start Q start afresh"));
  }
  memory = std::make_shared<BucketMemory>();
  memory->names = names;
  memory->batched = batched;
  return memory;
}

void PowerSGDState::chain(ProcessGroup& group, std::unique_ptr<InFlight> current, bool last) {
  // See Note [PowerSGD collective order].
  if (in_flight_) {
    auto previous = std::move(in_flight_);
    if (previous->index < current->index) {
      previous->batched ? finish_batched(group, *previous) : finish(group, *previous);
    } else {
      // An iteration that ended early (backward threw): nobody waits for it.
      previous->result->set_error(std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          c10::str(previous->result->name(),
                   ": abandoned, its iteration ended before the next bucket was launched"))));
    }
  }
  if (last) {
    current->batched ? finish_batched(group, *current) : finish(group, *current);
    ++iteration_;
  } else {
    in_flight_ = std::move(current);
  }
}

// ---- Checkpoints ----------------------------------------------------------------------
//
// save_state pickles one dict (framed with a length and checksum, as the
// object collectives frame theirs): "format", "options" (each option by its
// name), "iteration", "rng" (the seed generator's state, as text),
// "counters" [bytes_allreduced, allreduce_calls, numel_before, numel_after],
// and "buckets": per memory [index, names, batched, error, q] (undefined
// tensors as None; CPU copies).

namespace {

constexpr int64_t kPowerSgdStateFormat = 1;

c10::impl::GenericDict options_dict(const PowerSGDOptions& o) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("matrix_approximation_rank", o.matrix_approximation_rank());
  d.insert("start_powerSGD_iter", o.start_powerSGD_iter());
  d.insert("min_compression_rate", o.min_compression_rate());
  d.insert("use_error_feedback", o.use_error_feedback());
  d.insert("warm_start", o.warm_start());
  d.insert("orthogonalization_epsilon", o.orthogonalization_epsilon());
  d.insert("random_seed", static_cast<int64_t>(o.random_seed()));
  d.insert("batch_tensors_with_same_shape", o.batch_tensors_with_same_shape());
  return d;
}

c10::IValue cpu_or_none(const at::Tensor& t) {
  return t.defined() ? c10::IValue(t.detach().cpu().clone()) : c10::IValue();
}

// Reading a saved state: every access checked, so that a state of another
// shape is an error naming what is wrong, never a crash.
struct Reader {
  std::string who;

  [[noreturn]] void fail(const std::string& what) const {
    DDP_CHECK(false, who, ": ", what);
    throw; // not reached
  }
  c10::IValue at(const c10::impl::GenericDict& d, const char* key) const {
    auto it = d.find(key);
    if (it == d.end()) {
      fail(c10::str("the saved state has no '", key, "'"));
    }
    return it->value();
  }
  int64_t integer(const c10::IValue& v, const char* what) const {
    if (!v.isInt()) {
      fail(c10::str("'", what, "' is a ", v.tagKind(), ", expected an int"));
    }
    return v.toInt();
  }
  at::Tensor tensor_or_none(const c10::IValue& v, const char* what) const {
    if (v.isNone()) {
      return at::Tensor();
    }
    if (!v.isTensor()) {
      fail(c10::str("'", what, "' is a ", v.tagKind(), ", expected a tensor or None"));
    }
    return v.toTensor();
  }
};

} // namespace

std::string PowerSGDState::kind() const {
  return "powerSGD";
}

std::string PowerSGDState::save_state() const {
  // A bucket left between its two allreduces by a backward that threw is
  // abandoned (the next hook call fails its Work): its memory is as the
  // last completed iteration left it, which is what is saved. Throwing here
  // instead would fail save_checkpoint's gather on this rank alone.
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("format", kPowerSgdStateFormat);
  state.insert("options", options_dict(options_));
  state.insert("iteration", iteration_.load());
  std::ostringstream rng;
  rng << seed_rng_;
  state.insert("rng", rng.str());
  state.insert("counters", c10::List<int64_t>({static_cast<int64_t>(bytes_allreduced_.load()),
                                               static_cast<int64_t>(allreduce_calls_.load()),
                                               numel_before_.load(), numel_after_.load()}));
  c10::impl::GenericList buckets(c10::AnyType::get());
  auto add = [&](int64_t index, const BucketMemory& memory) {
    c10::List<std::string> names;
    for (const auto& name : memory.names) {
      names.push_back(name);
    }
    std::vector<c10::IValue> fields{index, names, memory.batched, cpu_or_none(memory.error), cpu_or_none(memory.q)};
    buckets.push_back(c10::ivalue::Tuple::create(std::move(fields)));
  };
  for (const auto& [index, memory] : memories_) {
    add(static_cast<int64_t>(index), *memory);
  }
  for (const auto& memory : restored_) {
    add(-1, *memory); // loaded, not claimed yet
  }
  state.insert("buckets", buckets);
  return ddp::internal::encode_ivalue(state);
}

void PowerSGDState::load_state(const std::vector<std::string>& saved, int rank, int world_size) {
  const Reader r{c10::str("[rank ", rank, "/", world_size, "] PowerSGDState::load_state")};
  DDP_CHECK(!saved.empty(), r.who, ": the checkpoint holds no rank's state");
  const bool same_world = static_cast<int>(saved.size()) == world_size;
  const int source = same_world ? rank : 0;
  const std::string& bytes = saved[static_cast<size_t>(source)];
  const c10::IValue value = ddp::internal::decode_ivalue(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                         bytes.size(), r.who, c10::str("rank ", source));
  if (!value.isGenericDict()) {
    r.fail(c10::str("the saved state is a ", value.tagKind(), ", expected a dict"));
  }
  const auto state = value.toGenericDict();
  const int64_t format = r.integer(r.at(state, "format"), "format");
  DDP_CHECK(format == kPowerSgdStateFormat, r.who, ": the saved state has format ", format, ", this ddp reads ",
            kPowerSgdStateFormat);

  // The options must be this state's: the memories' shapes depend on them.
  const c10::IValue saved_options = r.at(state, "options");
  if (!saved_options.isGenericDict()) {
    r.fail("'options' is not a dict");
  }
  for (const auto& mine : options_dict(options_)) {
    const auto it = saved_options.toGenericDict().find(mine.key());
    DDP_CHECK(it != saved_options.toGenericDict().end(), r.who, ": the saved state has no option '",
              mine.key().toStringRef(), "'");
    DDP_CHECK(it->value() == mine.value(), r.who, ": the checkpoint was saved with ", mine.key().toStringRef(),
              " = ", it->value(), ", this state has ", mine.value(),
              "; resume with the options of the run that saved it");
  }

  const int64_t iteration = r.integer(r.at(state, "iteration"), "iteration");
  const c10::IValue rng_text = r.at(state, "rng");
  std::mt19937 rng;
  {
    if (!rng_text.isString()) {
      r.fail("'rng' is not a string");
    }
    std::istringstream in(rng_text.toStringRef());
    in >> rng;
    DDP_CHECK(!in.fail(), r.who, ": 'rng' is not a generator state");
  }
  const c10::IValue counters_value = r.at(state, "counters");
  if (!counters_value.isIntList() || counters_value.toIntList().size() != 4) {
    r.fail("'counters' is not a list of 4 ints");
  }
  const auto counters = counters_value.toIntList().vec();

  const c10::IValue buckets_value = r.at(state, "buckets");
  if (!buckets_value.isList()) {
    r.fail("'buckets' is not a list");
  }
  std::vector<std::shared_ptr<BucketMemory>> restored;
  for (const c10::IValue& entry : buckets_value.toListRef()) {
    if (!entry.isTuple() || entry.toTupleRef().elements().size() != 5) {
      r.fail("a bucket entry is not a tuple of 5");
    }
    const std::vector<c10::IValue> fields = entry.toTupleRef().elements().vec();
    auto memory = std::make_shared<BucketMemory>();
    if (!fields[1].isList() || !fields[2].isBool()) {
      r.fail("a bucket entry's names or kind is malformed");
    }
    for (const c10::IValue& name : fields[1].toListRef()) {
      if (!name.isString()) {
        r.fail("a bucket entry's parameter name is not a string");
      }
      memory->names.push_back(name.toStringRef());
    }
    memory->batched = fields[2].toBool();
    memory->error = same_world ? r.tensor_or_none(fields[3], "error") : at::Tensor();
    memory->q = r.tensor_or_none(fields[4], "q");
    restored.push_back(std::move(memory));
  }
  if (!same_world && rank == 0) {
    ddp::internal::log_warning(c10::str(
        r.who, ": the checkpoint was saved by ", saved.size(), " ranks, this run has ", world_size,
        ": every rank takes rank 0's state without the error feedback, which was per rank (the next "
        "compressions start with none)"));
  }

  // Everything read: now replace. A bucket that a failed backward left
  // between its allreduces belongs to the state being replaced.
  if (in_flight_) {
    in_flight_->result->set_error(std::make_exception_ptr(
        c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                   c10::str(in_flight_->result->name(), ": abandoned, the state was loaded from a checkpoint"))));
    in_flight_.reset();
  }
  iteration_ = iteration;
  seed_rng_ = rng;
  bytes_allreduced_ = static_cast<uint64_t>(counters[0]);
  allreduce_calls_ = static_cast<uint64_t>(counters[1]);
  numel_before_ = counters[2];
  numel_after_ = counters[3];
  memories_.clear();
  restored_ = std::move(restored);
}

} // namespace ddp::comm_hooks
