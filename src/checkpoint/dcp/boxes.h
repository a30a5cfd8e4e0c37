#pragma once

// Boxes of tensors (private header): the pieces DCP saves and reads.
//
// FSDP keeps each rank's shard as a range of a flat buffer in which the
// unit's parameters lie end to end, so the part of a parameter that a rank
// holds is a contiguous range of its row-major elements, not in general a
// box. A range is the union of at most 2 * dims - 1 boxes: a partial first
// row (itself split the same way one dimension down), whole rows, a
// partial last row. Worked example, a 4 x 3 weight, elements [2, 10):
// row 0 columns [2, 3) is box (0, 2) size (1, 1); rows 1 and 2 whole are
// box (1, 0) size (2, 3); row 3 columns [0, 1) is box (3, 0) size (1, 1).
// Each box is itself contiguous in row-major order (only its first
// dimension that is not 1 is partial), so it is a view of the flat shard.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "checkpoint/dcp/metadata.h"

namespace ddp::checkpoint::dcp {

struct FlatBox {
  Box box;
  int64_t flat_begin = 0; // row-major index of its first element
};

// The boxes whose union is elements [begin, end) of a tensor of `shape`, in
// row-major order.
std::vector<FlatBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// The intersection of two boxes of one tensor, or nullopt when empty.
std::optional<Box> intersect(const Box& a, const Box& b);

// `tensor` (holding box `whole`) narrowed to `part` (within `whole`).
at::Tensor narrow_to(const at::Tensor& tensor, const Box& whole, const Box& part);

} // namespace ddp::checkpoint::dcp
