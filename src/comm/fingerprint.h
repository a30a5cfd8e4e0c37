#pragma once

// Collective fingerprints (private header). See Note [Collective
// fingerprints] in fingerprint.cpp.

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ddp/comm/types.h>
#include <ddp/store/store.h>

#include "comm/collective_label.h"

namespace ddp::internal {

// What one rank's call of a collective is: two ranks' calls of the same
// collective must have equal fingerprints.
struct Fingerprint {
  Fingerprint() = default;
  // The sequence number is the group's to set.
  explicit Fingerprint(std::string op, std::optional<at::ScalarType> dtype = std::nullopt,
                       int64_t numel = 0, std::optional<ReduceOp> reduce = std::nullopt, int root = -1)
      : op(std::move(op)), dtype(dtype), numel(numel), reduce(reduce), root(root) {}

  std::string op;                           // "allreduce"
  uint64_t seq = 0;                         // the group's sequence number
  std::optional<at::ScalarType> dtype;      // none for a barrier
  int64_t numel = 0;                        // elements this rank contributes;
                                            // kSparse: a sparse tensor's, which
                                            // the collective checks itself
  static constexpr int64_t kSparse = -1;
  // kUneven: an all-to-all with split sizes, whose element counts differ
  // from rank to rank; the collective compares the splits itself.
  static constexpr int64_t kUneven = -2;
  std::optional<ReduceOp> reduce;           // reductions only
  int root = -1;                            // rooted collectives only
  // Who issued it (comm/collective_label.h): shown, not compared.
  std::string label = current_collective_label();

  // "allreduce #4 with float32[1000] SUM (ZeRO step)": what messages quote.
  std::string describe() const;
  // The call without the op name and sequence number: "float32[1000] SUM".
  std::string shape() const;
  // What two ranks compare: "allreduce|float32[1000] SUM".
  std::string key() const;
  // What a rank publishes for the others: key(), then the label after a
  // unit separator ('\x1f').
  std::string published() const;
  // 24 bits of a hash of everything but the sequence number.
  uint32_t hash24() const;
  // 63 bits of the same hash (non-negative as an int64_t), for the MPI
  // backend's check (see Note [Collective fingerprints]).
  int64_t hash63() const;
};

// The message of a mismatch between `mine` and what rank `their_rank`
// published for the same sequence number (its `published()`): "rank 0
// called allreduce #4 with float32[1000] SUM (DDP buffer broadcast), this
// rank float32[2000] SUM (SyncBatchNorm 'bn1' forward)".
std::string mismatch_message(const Fingerprint& mine, int their_rank, const std::string& their_published);

// The Gloo tag of a collective: its sequence number (low 8 bits: at most
// two collectives are in flight at once, and a rank can run ahead of its
// peers only by collectives that do not wait for them) and 24 bits of its
// fingerprint's hash, so that two ranks that call different collectives at
// the same point never exchange data (but one pair in 2^24 of different
// calls does).
uint32_t fingerprint_tag(const Fingerprint& fingerprint);

// Compares a stalled collective's fingerprint with the other ranks' through
// the group's store: each rank publishes its fingerprint for a sequence
// number once, under `prefix`.
//
// Thread-safety: safe to call from several threads (the group's monitor
// thread and its workers); calls are serialised by an internal mutex.
class FingerprintExchange {
 public:
  FingerprintExchange(std::shared_ptr<Store> store, std::string prefix, int rank, int size);

  // Publishes `fingerprint` (once per sequence number) and reads the
  // fingerprints that the other ranks published for the same number. Returns
  // the message of a mismatch, "rank 0 called allreduce #4 with float32[1000]
  // SUM, this rank float32[2000] SUM", or nullopt when every rank that
  // published agrees. Never blocks on a missing key.
  std::optional<std::string> publish_and_compare(const Fingerprint& fingerprint);

  // The ranks that have not published a fingerprint for `seq` (not reached
  // that collective, as far as the store knows), for timeout messages.
  std::vector<int> ranks_missing(uint64_t seq);

  // The ranks that had not published for `seq` when this rank last compared
  // (publish_and_compare), without reading the store: what a timeout can
  // still say once the store has gone (its server ended with rank 0).
  // Empty when this rank never published for `seq`.
  std::vector<int> ranks_missing_when_last_compared(uint64_t seq);

  // Once this rank has found a mismatch at `seq`: says so in the store, then
  // waits, for at most `patience`, until every other rank that published a
  // fingerprint for `seq` has said so too (each is in that collective, which
  // fails for it once this rank's connections close, and then reads the
  // store to explain its failure). The store may live in this process (rank
  // 0 hosts it under ddprun and torchrun): leaving at once would take it
  // away before those ranks have read it, and they would report a lost
  // connection instead of the mismatch. Never waits for a rank that had not
  // reached `seq`.
  void acknowledge_mismatch(uint64_t seq, std::chrono::milliseconds patience);

 private:
  std::string key(uint64_t seq, int rank) const;

  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  std::mutex mutex_;
  // The sequence numbers published, the latest few (at most two collectives
  // run at once), each with the ranks already found to agree (not read
  // again: a long collective is compared every few hundred ms). Guarded by
  // mutex_.
  std::vector<std::pair<uint64_t, std::vector<bool>>> published_;
};

// Whether the MAX-allreduce of every rank's (h, -h), h = hash63(), shows
// that every rank hashed the same fingerprint: the largest h is then minus
// the largest -h. (The MPI and NCCL backends' checks.)
inline bool hashes_agree(int64_t largest, int64_t negated_smallest) {
  return largest == -negated_smallest;
}

// Why the ranks' hashes differ, once a hash check found that they do: polls
// `exchange` (publish_and_compare, which publishes `mine` first) every
// `interval` until a rank's fingerprint is found to differ from `mine`, or
// every other rank has published one that agrees, or `patience` has passed.
// Returns the mismatch message ("rank 0 called allreduce #4 with
// float32[1000] SUM, this rank float32[2000] SUM"), or, when no rank's
// fingerprint could be read to differ, "the ranks' fingerprints differ
// (allreduce #4 with float32[2000] SUM on this rank); rank(s) [0] had not
// published theirs within 5000 ms". Blocks for at most about `patience`
// plus one round of store calls; never throws for a store failure (the
// message then says so).
std::string explain_hash_difference(FingerprintExchange& exchange, const Fingerprint& mine,
                                    std::chrono::milliseconds patience,
                                    std::chrono::milliseconds interval);

} // namespace ddp::internal
