#pragma once

// The Gloo backend's side of the buffers in shared memory (private header):
// the small collectives they need (Note [Shared buffers] in
// comm/shm/shared_buffers.h), as Gloo messages with the collective's tag and
// deadline.

#include "comm/gloo/gloo_api.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/shm/shared_buffers.h"

namespace ddp::internal {

// Valid for one task of a Gloo group's worker: every call shares the task's
// tag and deadline. Throws gloo::IoException on a timeout or a lost peer,
// as Gloo's own algorithms do, so that the group reports it alike (the
// peer named).
class GlooCoordinator final : public shm::Coordinator {
 public:
  GlooCoordinator(std::shared_ptr<gloo::Context> context, uint32_t tag, std::chrono::milliseconds timeout);

  void max(int64_t* values, size_t count) override;
  // One exchange of a word with every rank: one round of messages.
  void barrier() override;
  bool can_reduce_among() const override {
    return true;
  }
  void reduce_among(void* data, size_t count, size_t bytes, const std::vector<int>& members,
                    const ReduceKernel& kernel) override;

 private:
  std::chrono::milliseconds left() const;

  const std::shared_ptr<gloo::Context> context_;
  const uint32_t tag_;
  const std::chrono::steady_clock::time_point deadline_;
  const ReduceKernel max_;
  std::vector<int> everyone_;
};

// The shared path's size threshold: allreduces of more bytes than the
// exchange algorithm takes (Note [Exchange allreduce]), so that the buffers
// the ring would reduce are the ones reduced in shared memory, with its bits.
bool use_shared_allreduce(size_t bytes, int ranks);

} // namespace ddp::internal
