#pragma once

// Collectives on whole model states (private header): used by
// DistributedDataParallel's construction, its buffer broadcast, Join's final
// synchronisation and the debugging aids. Comparing what ranks built is
// comm/objects/same_on_every_rank.h.

#include <ATen/core/Tensor.h>

#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp::internal {

// What writing the broadcast values into a tensor does to its autograd
// version counter.
enum class VersionCounters {
  // Bumped, as by any in-place write: a graph that saved the tensor refuses
  // to run backward (parameters).
  kBump,
  // Left as they are: a graph that saved the tensor stays usable and reads
  // the new values. See Note [Buffers of a live graph] in state_sync.cpp.
  kPreserve,
};

// Broadcasts `tensors` from `root` in place, packing tensors of one dtype and
// device into one flat message each (coalesced), in a fixed order so that
// every rank issues the same collectives. No-op in a world of size 1.
void broadcast_coalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                         VersionCounters versions = VersionCounters::kBump);

} // namespace ddp::internal
