#pragma once

// Who issued a collective (private header): a label that ddp's own callers
// (DDP's buffer broadcast, SyncBatchNorm's statistics, ZeRO's step, FSDP's
// gathers) set around the collectives they issue, so that a mismatch or a
// timeout, the flight recorder and the timeline say "SyncBatchNorm
// 'generator.batch_norm1' forward" beside "allgather_into_tensor #694".
// Each collective's fingerprint takes the label of the thread that issues
// it (comm/fingerprint.h).
//
// Thread-safety: the label is per thread (thread_local).

#include <string>

namespace ddp::internal {

// The innermost label set on this thread, or "" (the program's own call).
const std::string& current_collective_label();

// Sets the label for its lifetime; nested guards restore the outer one.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  std::string outer_;
};

} // namespace ddp::internal
