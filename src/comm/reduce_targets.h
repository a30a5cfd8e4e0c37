#pragma once

// The gradients of ProcessGroup::reduce_gradients (private header): their
// checks, their scaled copy into the buffer, and the copy of a range of the
// reduced buffer into them.

#include <ddp/comm/process_group.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::internal {

// Checks reduce_gradients' `buffer` and `targets` (see its comment in
// process_group.h), naming `who` ("[rank 0/2] reduce_gradients"); returns
// the targets ordered by offset.
std::vector<ReduceTarget> checked_reduce_targets(const at::Tensor& buffer, std::vector<ReduceTarget> targets,
                                                 const std::string& who);

// Copies elements [begin, end) of a reduced buffer, read from `from` (which
// holds element `begin` first), into the parts of `targets` (ordered by
// offset) that lie in that range. When `rest` is not null (it holds element
// `begin` first too), the elements that no target covers are copied there.
void copy_to_targets(const uint8_t* from, int64_t begin, int64_t end, size_t element,
                     const std::vector<ReduceTarget>& targets, uint8_t* rest);

// copy_to_targets of all of `buffer` (the fallback paths).
void copy_to_targets(const at::Tensor& buffer, const std::vector<ReduceTarget>& targets);

// Each target times `scale` into its range of `buffer`, rounded as DDP's
// reducer rounds it (at::mul_out by a wrapped scalar).
void scale_into(const at::Tensor& buffer, const std::vector<ReduceTarget>& targets, double scale);

} // namespace ddp::internal
