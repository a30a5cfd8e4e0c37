// Note [Collective fingerprints]
// Ranks that call different collectives at the same point of their sequence
// (other sizes, dtypes, reduce ops, roots, or another collective altogether)
// must never exchange data: with Gloo, a size mismatch aborts the process
// inside Gloo's event loop (gloo::EnforceNotMet on a thread we do not own)
// or, worse, returns a partly reduced tensor; a dtype or reduce-op mismatch
// of equal size sums garbage. A fingerprint is what must agree: the op, the
// sequence number, the dtype, the element count, the reduce op, the root.
//
// Gloo. Every collective's tag is fingerprint_tag(): the sequence number
// (low 8 bits) and a 24-bit hash of the rest. Mismatched calls use
// different tags, so their messages never meet and no data moves: each side
// waits. The group's monitor thread (ProcessGroupGloo) wakes every 250 ms;
// for a task that has run for 1 s or more, it publishes the fingerprint to
// the store under the group's prefix and compares it with the ones the other
// ranks published for the same sequence number (FingerprintExchange). On a
// difference it records the message, marks the group broken and shuts the
// group's connections down, so that the stalled task fails at once; the
// worker then raises CollectiveMismatchError with both fingerprints. A peer
// whose task failed because of that shutdown finds the mismatch in the
// store too (its peer published before comparing), so every rank raises
// the same error naming both calls. A timeout names the ranks that had not
// published that sequence number (ranks_missing): the ranks that never
// reached the collective, as far as the store knows. Since a rank publishes
// only for a stalled collective, one that got through it quickly has not
// published it either; a fingerprint for one of the next numbers shows it
// got past, and one for an earlier number (with none since) that it is
// still stuck there, waiting in turn (netem_cases' link down: the rank
// whose last send crossed the dead link is one collective behind its
// neighbour, and neither is to blame).
//
// Why this design: the normal path costs a hash and nothing else (no extra
// message, no store access) for collectives that finish within a second;
// docs/benchmarks.md has the measurement. A header exchanged before each
// collective would cost a round trip on every small allreduce, which is
// most of its latency. What is left: two different calls whose 24-bit
// hashes are equal (one chance in 2^24 per mismatched call) still meet, as
// they did without fingerprints; Gloo's own size checks then end the process
// or the task, which we cannot intercept in a system Gloo.
//
// MPI has no tags on collectives: see Note [MPI fingerprint check] in
// comm/mpi/mpi_engine.h, which checks a 63-bit hash before every collective.
// NCCL has none either: see Note [NCCL fingerprint check] in
// comm/nccl/nccl_watchdog.cpp, which checks the same hash on the GPU, in the
// collective's own launch, and compares stalled collectives as Gloo does.

#include <ddp/comm/error.h>

#include "comm/fingerprint.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <thread>

namespace ddp::internal {

namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull;

// FNV-1a (64 bits), continuing `hash` over `size` bytes at `data`.
uint64_t fnv1a(uint64_t hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

// A hash of everything in `f` but the sequence number, from the fields
// themselves: it runs for every collective, so it builds no string. Equal
// on every rank for equal calls (the ranks run the same build).
uint64_t hash_of(const Fingerprint& f) {
  uint64_t hash = fnv1a(kFnvOffset, f.op.data(), f.op.size());
  const int32_t small[4] = {f.dtype ? static_cast<int32_t>(*f.dtype) : -1,
                            f.reduce ? static_cast<int32_t>(*f.reduce) : -1, f.root, 0};
  hash = fnv1a(hash, small, sizeof(small));
  return fnv1a(hash, &f.numel, sizeof(f.numel));
}

std::string dtype_name(at::ScalarType dtype) {
  // c10's names ("Float") as torch.distributed users know them ("float32").
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

} // namespace

std::string Fingerprint::shape() const {
  std::string text = !dtype                ? std::string("no tensor")
                     : numel == kSparse ? c10::str("sparse ", dtype_name(*dtype))
                     : numel == kUneven ? c10::str(dtype_name(*dtype), "[split]")
                                        : c10::str(dtype_name(*dtype), "[", numel, "]");
  if (reduce) {
    text += " " + to_string(*reduce);
  }
  if (root >= 0) {
    text += c10::str(" root ", root);
  }
  return text;
}

namespace {
std::string labelled(const std::string& text, const std::string& label) {
  return label.empty() ? text : text + " (" + label + ")";
}
} // namespace

std::string Fingerprint::describe() const {
  return labelled(c10::str(op, " #", seq, " with ", shape()), label);
}

std::string Fingerprint::key() const {
  return op + "|" + shape();
}

std::string Fingerprint::published() const {
  return key() + '\x1f' + label;
}

uint32_t Fingerprint::hash24() const {
  const uint64_t hash = hash_of(*this);
  return static_cast<uint32_t>(hash ^ (hash >> 24) ^ (hash >> 48)) & 0xFFFFFF;
}

int64_t Fingerprint::hash63() const {
  return static_cast<int64_t>(hash_of(*this) >> 1);
}

std::string mismatch_message(const Fingerprint& mine, int their_rank, const std::string& their_published) {
  const auto separator = their_published.find('\x1f');
  const std::string their_key = their_published.substr(0, separator);
  const std::string their_label = separator == std::string::npos ? "" : their_published.substr(separator + 1);
  const auto bar = their_key.find('|');
  const std::string their_op = bar == std::string::npos ? their_key : their_key.substr(0, bar);
  const std::string their_shape = bar == std::string::npos ? "" : their_key.substr(bar + 1);
  // The op once when both called the same one.
  const std::string this_rank = their_op == mine.op ? labelled(mine.shape(), mine.label) : mine.describe();
  return c10::str("rank ", their_rank, " called ", labelled(c10::str(their_op, " #", mine.seq, " with ", their_shape),
                                                            their_label),
                  ", this rank ", this_rank);
}

uint32_t fingerprint_tag(const Fingerprint& fingerprint) {
  return (static_cast<uint32_t>(fingerprint.seq & 0xFF) << 24) | fingerprint.hash24();
}

FingerprintExchange::FingerprintExchange(std::shared_ptr<Store> store, std::string prefix, int rank,
                                         int size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}

std::string FingerprintExchange::key(uint64_t seq, int rank) const {
  return c10::str(prefix_, seq, "/", rank);
}

std::optional<std::string> FingerprintExchange::publish_and_compare(const Fingerprint& fingerprint) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string mine = fingerprint.key();
  auto entry = std::find_if(published_.begin(), published_.end(),
                            [&](const Published& p) { return p.seq == fingerprint.seq; });
  if (entry == published_.end()) {
    store_->set(key(fingerprint.seq, rank_), fingerprint.published());
    if (published_.size() >= 4) {
      published_.erase(published_.begin());
    }
    published_.push_back({fingerprint.seq, std::vector<bool>(static_cast<size_t>(size_), false), {}});
    entry = published_.end() - 1;
  }
  auto& agreed = entry->agreed;
  std::vector<int> unpublished;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || agreed[r]) {
      continue;
    }
    if (!store_->check({key(fingerprint.seq, r)})) {
      unpublished.push_back(r);
      continue;
    }
    const std::string theirs = store_->get_string(key(fingerprint.seq, r));
    if (theirs.substr(0, theirs.find('\x1f')) != mine) { // the label is not compared
      return mismatch_message(fingerprint, r, theirs);
    }
    agreed[r] = true;
  }
  // Kept for a timeout after the store has gone (its server ends with rank
  // 0, which may be the first to time out).
  entry->absent = whereabouts_locked(fingerprint.seq, unpublished);
  return std::nullopt;
}

std::vector<int> FingerprintExchange::ranks_unpublished(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !store_->check({key(seq, r)})) {
      missing.push_back(r);
    }
  }
  return missing;
}

Absentees FingerprintExchange::ranks_missing(uint64_t seq) {
  const std::vector<int> unpublished = ranks_unpublished(seq);
  std::lock_guard<std::mutex> lock(mutex_);
  return whereabouts_locked(seq, unpublished);
}

Absentees FingerprintExchange::whereabouts_locked(uint64_t seq, const std::vector<int>& unpublished) {
  Absentees found;
  int looked_around = 0;
  for (const int r : unpublished) {
    if (looked_around++ >= kWhereaboutsLimit) {
      found.unseen.push_back(r);
      continue;
    }
    bool past = false;
    for (uint64_t later = seq + 1; later <= seq + kWhereaboutsWindow && !past; ++later) {
      past = store_->check({key(later, r)});
    }
    if (past) {
      continue;
    }
    std::optional<uint64_t> earlier;
    for (uint64_t before = seq; before > 0 && seq - before < kWhereaboutsWindow && !earlier; --before) {
      if (store_->check({key(before - 1, r)})) {
        earlier = before - 1;
      }
    }
    if (!earlier) {
      found.unseen.push_back(r);
      continue;
    }
    const std::string theirs = store_->get_string(key(*earlier, r));
    const std::string op = theirs.substr(0, std::min(theirs.find('|'), theirs.find('\x1f')));
    found.behind.emplace_back(r, c10::str(op, " #", *earlier));
  }
  return found;
}

std::string Absentees::clause(const std::string& op, uint64_t seq, const std::string& suffix) const {
  std::string text;
  if (!unseen.empty()) {
    text = c10::str("; rank(s) ", c10::ArrayRef<int>(unseen), " had not reached ", op, " #", seq, suffix);
  }
  for (size_t i = 0; i < behind.size(); ++i) {
    text += c10::str(i == 0 ? "; rank " : ", rank ", behind[i].first, i == 0 ? " was still in " : " in ",
                     behind[i].second);
  }
  return text;
}

Absentees FingerprintExchange::ranks_missing_when_last_compared(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& published : published_) {
    if (published.seq == seq) {
      return published.absent;
    }
  }
  return {};
}

void FingerprintExchange::acknowledge_mismatch(uint64_t seq, std::chrono::milliseconds patience) {
  const auto acknowledged = [&](int r) { return c10::str(key(seq, r), "/mismatch"); };
  std::vector<int> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store_->set(acknowledged(rank_), "1");
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && store_->check({key(seq, r)})) {
        waiting.push_back(r);
      }
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (int r : waiting) {
    while (!store_->check({acknowledged(r)}) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

std::string explain_hash_difference(FingerprintExchange& exchange, const Fingerprint& mine,
                                    std::chrono::milliseconds patience,
                                    std::chrono::milliseconds interval) {
  const std::string differ = c10::str("the ranks' fingerprints differ (", mine.describe(), " on this rank)");
  const auto deadline = std::chrono::steady_clock::now() + patience;
  try {
    for (;;) {
      if (auto mismatch = exchange.publish_and_compare(mine)) {
        return *mismatch;
      }
      // A peer whose collective completed found the difference too and
      // published at once; one whose collective hangs publishes when its
      // own stall check runs, a second or so later.
      const auto missing = exchange.ranks_unpublished(mine.seq);
      if (missing.empty()) {
        // Equal fingerprints but different hashes cannot happen with the
        // same build on every rank; fail safe all the same.
        return differ;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return c10::str(differ, "; rank(s) ", c10::ArrayRef<int>(missing),
                        " had not published theirs within ", patience.count(), " ms");
      }
      std::this_thread::sleep_for(interval);
    }
  } catch (const std::exception& e) {
    return c10::str(differ, "; the store could not be read to say how: ", error_message(e));
  }
}

} // namespace ddp::internal
