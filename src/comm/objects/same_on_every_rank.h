#pragma once

// One check that every rank built the same thing (private header).
// DistributedDataParallel's parameters, ZeroRedundancyOptimizer's parameter
// groups and FullyShardedDataParallel's units are each described as lines
// and compared here, so that the three say a difference the same way.

#include <c10/core/Device.h>

#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp::internal {

// Every rank's `mine`, indexed by rank. The bytes travel in tensors on
// `device` (NCCL moves device tensors only). Two allgathers (lengths, then
// the bytes padded to the longest).
std::vector<std::string> allgather_strings(ProcessGroup& group, const std::string& mine,
                                           c10::Device device);

// The words of a difference: "<who>: <differ>: rank(s) [1] differ from rank
// 0; first, <item> 3 is <line> on rank 1 but <line> on rank 0. <advice>".
struct SameOnEveryRank {
  std::string who;    // "[rank 1/2] DistributedDataParallel"
  std::string differ; // "the model differs across ranks"
  std::string item;   // what one line describes: "parameter"
  std::string advice; // "Every rank must wrap the same model: ..."
};

// Compares this rank's `lines` (one item each, no newline inside) with every
// other rank's: one allgather of a 63-bit hash of them, and only when the
// hashes differ, every rank's lines (allgather_strings). Then every rank
// throws the same c10::Error (difference_message), so that none goes on
// into a collective the others never issue. A collective of `group`; its
// tensors go to `device`.
void check_same_on_every_rank(ProcessGroup& group, const std::vector<std::string>& lines, c10::Device device,
                              const SameOnEveryRank& words);

// The message for every rank's lines (rank 0's the reference), or "" when
// they are all equal. Pure: the unit tests call it.
std::string difference_message(const std::vector<std::vector<std::string>>& ranks, const SameOnEveryRank& words);

} // namespace ddp::internal
