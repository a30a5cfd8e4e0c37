#pragma once

// The Gloo backend's sparse allreduce (private header).

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/gloo/gloo_api.h"

namespace ddp::internal {

// Note [Sparse allreduce]
// Gloo has no sparse collective, so a sparse allreduce is three allgathers
// under the task's tag, one after the other, as PyTorch's Gloo backend does
// it: a header per rank (dimensions, sparse dimensions, entries, elements
// per entry); every rank's sizes and indices; every rank's values. Gloo's
// allgather moves the same count from every rank, so each rank's indices and
// values are padded to the largest count. Every rank then concatenates all
// the entries in rank order and coalesces them: duplicate indices are
// added, so every rank ends with the same coalesced sum, which replaces the
// tensor's indices and values. Ranks whose tensors differ in dimensions or
// sizes all see it from the header and the sizes, and all raise the same
// c10::Error before the next allgather, so the group stays usable. CUDA
// tensors are reduced through host memory.

// See Note [Sparse allreduce]. Runs on a worker thread of the group, under
// the task's `tag` and deadline; `who` is "[rank R/W] allreduce #N".
DDP_GLOO_HIDDEN void sparse_allreduce(const std::shared_ptr<gloo::Context>& context,
                                      const at::Tensor& tensor, const std::string& who,
                                      uint32_t tag, std::chrono::milliseconds timeout);

} // namespace ddp::internal
