#include "comm/reduce_targets.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>

#include <algorithm>
#include <cstring>

#include "internal/check.h"

namespace ddp::internal {

std::vector<ReduceTarget> checked_reduce_targets(const at::Tensor& buffer, std::vector<ReduceTarget> targets,
                                                 const std::string& who) {
  DDP_CHECK(buffer.defined() && buffer.layout() == at::kStrided && buffer.is_cpu() && buffer.dim() == 1 &&
                buffer.is_contiguous(),
            who, ": expected a contiguous 1-D dense CPU tensor as the buffer, got ",
            buffer.defined() ? c10::str(buffer.scalar_type(), " ", buffer.sizes(), " on ", buffer.device(),
                                        buffer.is_contiguous() ? "" : ", not contiguous")
                             : std::string("an undefined tensor"));
  std::sort(targets.begin(), targets.end(),
            [](const ReduceTarget& a, const ReduceTarget& b) { return a.offset < b.offset; });
  const auto* base = static_cast<const uint8_t*>(buffer.data_ptr());
  const auto* end = base + buffer.nbytes();
  int64_t covered = 0; // the end of the previous target's range
  for (size_t i = 0; i < targets.size(); ++i) {
    const at::Tensor& t = targets[i].target;
    const int64_t offset = targets[i].offset;
    DDP_CHECK(t.defined() && t.layout() == at::kStrided && t.is_cpu() && t.is_contiguous() &&
                  t.scalar_type() == buffer.scalar_type(),
              who, ": the target at offset ", offset, " must be a contiguous dense CPU tensor of the buffer's dtype ",
              buffer.scalar_type(), ", got ",
              t.defined() ? c10::str(t.scalar_type(), " on ", t.device(), t.is_contiguous() ? "" : ", not contiguous")
                          : std::string("an undefined tensor"));
    DDP_CHECK(offset >= covered && offset + t.numel() <= buffer.numel(), who, ": the target at offset ", offset,
              " (", t.numel(), " elements) ",
              offset < covered ? c10::str("overlaps the range of another target, which ends at ", covered)
                               : c10::str("ends past the buffer's ", buffer.numel(), " elements"),
              "; expected ranges of the buffer that do not overlap");
    const auto* data = static_cast<const uint8_t*>(t.data_ptr());
    DDP_CHECK(t.numel() == 0 || data + t.nbytes() <= base || end <= data, who, ": the target at offset ", offset,
              " lies in the buffer's own memory; expected memory apart from it");
    covered = offset + t.numel();
  }
  return targets;
}

void copy_to_targets(const uint8_t* from, int64_t begin, int64_t end, size_t element,
                     const std::vector<ReduceTarget>& targets, uint8_t* rest) {
  // The first target that ends after `begin`.
  auto it = std::upper_bound(targets.begin(), targets.end(), begin, [](int64_t at, const ReduceTarget& t) {
    return at < t.offset + t.target.numel();
  });
  int64_t at = begin; // copied up to here
  const auto bytes = [element](int64_t n) { return static_cast<size_t>(n) * element; };
  for (; it != targets.end() && it->offset < end; ++it) {
    const int64_t from_here = std::max(at, it->offset);
    const int64_t to_here = std::min(end, it->offset + it->target.numel());
    if (rest != nullptr && from_here > at) {
      std::memcpy(rest + bytes(at - begin), from + bytes(at - begin), bytes(from_here - at));
    }
    auto* into = static_cast<uint8_t*>(it->target.data_ptr()) + bytes(from_here - it->offset);
    std::memcpy(into, from + bytes(from_here - begin), bytes(to_here - from_here));
    at = to_here;
  }
  if (rest != nullptr && at < end) {
    std::memcpy(rest + bytes(at - begin), from + bytes(at - begin), bytes(end - at));
  }
}

void copy_to_targets(const at::Tensor& buffer, const std::vector<ReduceTarget>& targets) {
  copy_to_targets(static_cast<const uint8_t*>(buffer.data_ptr()), 0, buffer.numel(), buffer.element_size(),
                  targets, nullptr);
}

void scale_into(const at::Tensor& buffer, const std::vector<ReduceTarget>& targets, double scale) {
  const auto factor = at::native::wrapped_scalar_tensor(scale);
  for (const auto& t : targets) {
    at::Tensor range = buffer.narrow(0, t.offset, t.target.numel());
    at::mul_out(range, t.target.view({-1}), factor);
  }
}

} // namespace ddp::internal
