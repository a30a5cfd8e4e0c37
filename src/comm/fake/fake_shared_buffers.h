#pragma once

// The fake backend's shared buffers (private header): with DDP_FAKE_SHM=1,
// a fake group hands out collective and common buffers where Gloo would put
// them in shared memory, so that a fake run takes the paths a real Gloo job
// takes. See Note [Shared buffers in the fake].

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp::internal {

// Note [Shared buffers in the fake]
// On Gloo (and MPI), when a group's ranks share a host, DDP's buckets and
// FSDP's reduce buffers lie in memory that the host's ranks map, and FSDP's
// shard group on one host gathers each unit into one buffer that they all
// map, its all-gather a barrier (Note [Gathered in common memory]). The
// fake, by default, shares nothing: FSDP there gathers by copying its shard
// into every slot of a private buffer, work the real job does not do, so
// a fake run's compute (what bench/scaling/validate.py measures) is longer
// than the real job's wherever the real job gathers in common memory.
// With DDP_FAKE_SHM=1 the fake decides as Gloo does, from the layout
// (LOCAL_WORLD_SIZE ranks per host, the world's ranks in order, or
// DDP_FAKE_LINK's per_host): a group shares buffers when its members lie on
// one host, or on several that hold the same number of them, two or more;
// a common buffer only on one host; a buffer only on the CPU and from 64 KiB
// (ProcessGroupGlooOptions' default shared_memory_min_bytes). The buffers
// are this process's own memory (zero-filled, paged in as touched, as a
// mapping is), counted in the plan's tensor memory as the real ones are: a
// collective buffer whole, a common buffer by this rank's part of it.
// Operations on them complete as every fake operation does: a barrier at
// once, a reduce_scatter whose output is this rank's part of its input
// copying nothing.

class FakeSharedBuffers {
 public:
  // From DDP_FAKE_SHM; nullptr when it is unset or 0. `per_host`: ranks per
  // host (DDP_FAKE_LINK's when set), else 0 for LOCAL_WORLD_SIZE's. Throws,
  // after `who`, on a malformed value.
  static std::unique_ptr<FakeSharedBuffers> from_env(const std::string& who, int per_host);

  explicit FakeSharedBuffers(int per_host);

  // Whether Gloo would share buffers among a group of these world ranks.
  bool shares(const std::vector<int>& members) const;
  // Whether they lie on one host (common buffers).
  bool on_one_host(const std::vector<int>& members) const;
  // Whether a buffer of `numel` elements of `options` would be shared.
  static bool large_enough(int64_t numel, const at::TensorOptions& options);

  // A zero-filled 1-D CPU tensor of `numel` elements, of which the plan's
  // tensor memory counts `counted_bytes`.
  at::Tensor allocate(int64_t numel, const at::TensorOptions& options, int64_t counted_bytes);
  // Whether `tensor` lies in a buffer from `allocate` that is still alive.
  bool contains(const at::Tensor& tensor) const;

  int per_host() const {
    return per_host_;
  }

 private:
  // Shared with the buffers' deleters, which may run after the group is gone.
  struct Registry {
    std::mutex mutex;
    std::map<const uint8_t*, size_t> bytes_at; // guarded by mutex: base -> bytes
  };

  int per_host_;
  std::shared_ptr<Registry> registry_;
};

} // namespace ddp::internal
