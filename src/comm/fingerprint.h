#pragma once

// Collective fingerprints (private header). See Note [Collective
// fingerprints] in fingerprint.cpp.

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ddp/comm/types.h>
#include <ddp/store/store.h>

namespace ddp::internal {

// What one rank's call of a collective is: two ranks' calls of the same
// collective must have equal fingerprints.
struct Fingerprint {
  std::string op;                           // "allreduce"
  uint64_t seq = 0;                         // the group's sequence number
  std::optional<at::ScalarType> dtype;      // none for a barrier
  int64_t numel = 0;                        // elements this rank contributes
  std::optional<ReduceOp> reduce;           // reductions only
  int root = -1;                            // rooted collectives only

  // "allreduce #4 with float32[1000] SUM": what messages quote.
  std::string describe() const;
  // The call without the op name and sequence number: "float32[1000] SUM".
  std::string shape() const;
  // 16 bits of a hash of everything but the sequence number.
  uint16_t hash16() const;
};

// The Gloo tag of a collective: its sequence number (low 16 bits; at most
// two collectives are in flight at once) and its fingerprint's hash, so that
// two ranks that call different collectives at the same point never exchange
// data.
uint32_t fingerprint_tag(const Fingerprint& fingerprint);

// Compares a stalled collective's fingerprint with the other ranks' through
// the group's store: each rank publishes its fingerprint for a sequence
// number once, under `prefix`.
//
// Thread-safety: one caller at a time (the group's monitor thread).
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

 private:
  std::string key(uint64_t seq, int rank) const;

  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  std::optional<uint64_t> published_; // the last sequence number published
};

} // namespace ddp::internal
