#include "comm/gloo/gloo_shared_buffers.h"

#include <algorithm>

#include "comm/gloo/gloo_exchange_allreduce.h"

namespace ddp::internal {

namespace {

// Slot prefixes (gloo_exchange_allreduce.cpp lists the others): the whole
// group's coordination, and the reductions among one rank per host.
constexpr uint8_t kCoordinationSlotPrefix = 0x22;
constexpr uint8_t kAmongSlotPrefix = 0x23;

} // namespace

GlooCoordinator::GlooCoordinator(std::shared_ptr<gloo::Context> context, uint32_t tag,
                                 std::chrono::milliseconds timeout)
    : context_(std::move(context)),
      tag_(tag),
      deadline_(std::chrono::steady_clock::now() + timeout),
      max_(reduce_kernel(at::kLong, ReduceOp::kMax)) {
  everyone_.resize(static_cast<size_t>(context_->size));
  for (int r = 0; r < context_->size; ++r) {
    everyone_[r] = r;
  }
}

std::chrono::milliseconds GlooCoordinator::left() const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

void GlooCoordinator::max(int64_t* values, size_t count) {
  exchange_among(context_, everyone_, kCoordinationSlotPrefix, values, count, count * sizeof(int64_t), max_,
                 tag_, left());
}

void GlooCoordinator::barrier() {
  int64_t word = 0;
  max(&word, 1);
}

void GlooCoordinator::reduce_among(void* data, size_t count, size_t bytes, const std::vector<int>& members,
                                   const ReduceKernel& kernel) {
  // Both combine in member order: the same bits whichever runs.
  if (members.size() > 2 && bytes > kExchangeAllreduceMaxBytes) {
    scatter_gather_among(context_, members, kAmongSlotPrefix, data, count, bytes, kernel, tag_, left());
  } else {
    exchange_among(context_, members, kAmongSlotPrefix, data, count, bytes, kernel, tag_, left());
  }
}

bool use_shared_allreduce(size_t bytes, int ranks) {
  return ranks > 1 && !use_exchange_allreduce(bytes, ranks);
}

} // namespace ddp::internal
