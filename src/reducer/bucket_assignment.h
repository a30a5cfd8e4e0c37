#pragma once

// Bucket assignment: which gradients share a bucket (private header).
//
// How it works. Gradients are visited in "fill order": reverse parameter
// order at first (the last layer's gradients are ready first in backward),
// and after the first iteration the order in which they actually became
// ready. Each (dtype, device) pair fills its own open bucket; a bucket closes
// once its size reaches the current limit. Limits are taken in sequence per
// (dtype, device), the last one repeating: with {1 MiB, 25 MiB}, the first
// bucket closes at 1 MiB so that communication starts early, the others at
// 25 MiB. A sparse gradient takes a bucket of its own, which closes at once
// and counts towards no limit (c10d's expect_sparse_gradient: sparse
// tensors are reduced one per allreduce). Buckets come out in the order of
// their first gradient in fill order, which is the order they become ready
// and are launched.
//
// A pure function of its inputs: no tensors, no process group (c10d's
// compute_bucket_assignment_by_size, in our terms).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <vector>

namespace ddp::internal {

// What bucket assignment needs to know of one gradient.
struct GradientSpec {
  c10::ScalarType dtype;
  c10::Device device;
  size_t bytes;
  // The gradient is sparse (an Embedding's with sparse(true)): it gets a
  // bucket of its own.
  bool sparse = false;
};

// Returns buckets of indices into `gradients`. `size_limits_bytes` must not
// be empty; `fill_order` is a permutation of the indices, or empty for
// reverse index order.
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<GradientSpec>& gradients,
    const std::vector<size_t>& size_limits_bytes,
    const std::vector<size_t>& fill_order = {});

} // namespace ddp::internal
