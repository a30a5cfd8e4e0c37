#include <ddp/comm/process_group.h>

#include <ATen/ATen.h>

#include "internal/check.h"

namespace ddp {

ProcessGroup::ProcessGroup(int rank, int size, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout) {
  DDP_CHECK(size >= 1, "ProcessGroup: world size must be at least 1 (got ", size, ")");
  DDP_CHECK(rank >= 0 && rank < size, "ProcessGroup: rank ", rank,
            " is out of range for world size ", size, " (expected 0 <= rank < world size)");
  DDP_CHECK(timeout.count() > 0, "ProcessGroup: timeout must be positive (got ",
            timeout.count(), " ms)");
}

ProcessGroup::ProcessGroup(NonMemberTag, int size, std::chrono::milliseconds timeout)
    : rank_(-1), size_(size), timeout_(timeout) {
  DDP_CHECK(size >= 1, "ProcessGroup: group size must be at least 1 (got ", size, ")");
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::wait_for_pending_work() {}

at::Tensor ProcessGroup::allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) {
  DDP_CHECK(numel >= 0, rank_prefix(), " allocate_collective_buffer: numel must not be negative (got ",
            numel, ")");
  return at::zeros({numel}, options);
}

bool ProcessGroup::supports_sparse_allreduce(c10::DeviceType /*device_type*/) const {
  return sparse_allreduce_;
}

std::string ProcessGroup::rank_prefix() const {
  return c10::str("[rank ", rank_, "/", size_, "]");
}

std::chrono::milliseconds ProcessGroup::resolve_timeout(std::chrono::milliseconds requested) const {
  if (requested == kUseGroupTimeout) {
    return timeout_;
  }
  DDP_CHECK(requested.count() > 0, rank_prefix(), " timeout must be positive or kUseGroupTimeout (got ",
            requested.count(), " ms)");
  return requested;
}

} // namespace ddp
