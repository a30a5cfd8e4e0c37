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

// The ranks that had not published a fingerprint for a sequence number, as
// the store tells where they are (FingerprintExchange::ranks_missing).
struct Absentees {
  // No fingerprint for it, nor for the collectives just before or after:
  // they had not reached it, as far as the store knows.
  std::vector<int> unseen;
  // Ranks whose latest fingerprint is of an earlier collective: still in
  // it, each with that collective ("allreduce #105"). Waiting, like this
  // rank, for someone else: a timeout does not blame them.
  std::vector<std::pair<int, std::string>> behind;

  bool empty() const {
    return unseen.empty() && behind.empty();
  }
  // "; rank(s) [2, 3] had not reached allreduce #106; rank 0 was still in
  // allreduce #105", or "" when empty; `suffix` ends the first part (" when
  // this rank last read the store").
  std::string clause(const std::string& op, uint64_t seq, const std::string& suffix = "") const;
};

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

  // The ranks that have not published a fingerprint for `seq`.
  std::vector<int> ranks_unpublished(uint64_t seq);

  // The same ranks, for timeout messages. A rank publishes only once its collective has run for a
  // while, so one that finished `seq` quickly has none for it: a fingerprint
  // for one of the next few sequence numbers shows that it got past `seq`
  // (it is left out), one for the few before, with none since, that it is
  // still in an earlier collective (`behind`). Looks around for at most
  // kWhereaboutsLimit ranks (two store reads each at most per number
  // looked at); the others are `unseen`.
  Absentees ranks_missing(uint64_t seq);
  static constexpr int kWhereaboutsLimit = 32;
  static constexpr uint64_t kWhereaboutsWindow = 3;

  // ranks_missing(seq) as this rank's last publish_and_compare found it,
  // without reading the store: what a timeout can still say once the store
  // has gone (its server ended with rank 0). Empty when this rank never
  // published for `seq`.
  Absentees ranks_missing_when_last_compared(uint64_t seq);

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
  // ranks_missing for the ranks in `unpublished`. Takes mutex_ held.
  Absentees whereabouts_locked(uint64_t seq, const std::vector<int>& unpublished);

  // A sequence number this rank published, with the ranks already found to
  // agree (not read again: a long collective is compared every few hundred
  // ms) and where the others were at the last comparison.
  struct Published {
    uint64_t seq;
    std::vector<bool> agreed;
    Absentees absent;
  };
  // The latest few (at most two collectives run at once). Guarded by mutex_.
  std::vector<Published> published_;
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
