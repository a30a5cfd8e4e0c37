#pragma once

// The small pieces of the NCCL backend that speak CUDA and NCCL types
// (private header; compiled only with DDP_WITH_NCCL): an owned CUDA event,
// the memory of the fingerprint checks, the mapping of dtypes and ReduceOps
// to NCCL's, and the conversion of NCCL and CUDA error codes into our
// CommError family.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/comm/types.h>

// Non-blocking communicators (ncclConfig_t, NCCL 2.14) are what lets
// communicator creation and group launches be bounded by a deadline instead
// of blocking the calling thread until every peer shows up.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "ddp's NCCL backend needs NCCL >= 2.14 (non-blocking communicators); set NCCL_ROOT to a newer NCCL"
#endif

namespace ddp::internal {

// An owned cudaEvent_t, created without timing (the cheapest kind), on the
// device that is current when it is constructed.
//
// Thread-safety: `query` and `get` may be called from any thread; `record`
// from one thread at a time.
class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();

  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Captures the work queued on `stream` so far.
  void record(cudaStream_t stream);
  // True once the captured work has completed. Throws CommError on a CUDA
  // error (a kernel fault, for example), which is sticky for the device.
  bool query() const;
  // Makes `stream` wait, on the GPU, for the captured work.
  void block(cudaStream_t stream) const;

  cudaEvent_t get() const {
    return event_;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// The memory of one engine's fingerprint checks (Note [NCCL fingerprint
// check] in nccl_watchdog.cpp): for each operation in flight, a slot of two
// int64 in pinned host memory, which the launch writes (h, -h) into and the
// result is copied back to, and two on the device, which NCCL reduces in
// place. Slots come in chunks of kSlotsPerChunk, allocated when none is
// free (the first checked launch, and whenever more operations are in
// flight than there are slots): the host part from LibTorch's pinned
// allocator, the device part from the caching allocator on the
// communicator's stream, so that only that stream, in order, reuses it.
//
// A slot is free again when the Lease holding it is destroyed. Its NcclWork
// holds the Lease, and the watchdog holds the Work until the operation's
// end event has completed (so its copies are done) or the group has failed
// (after which no launch writes a slot again); so a launch never writes a
// slot whose previous copies may still be pending.
//
// Thread-safety: `acquire` and the destruction of Leases may run on any
// thread; the chunks and the free list are guarded by a mutex.
class FingerprintSlots : public std::enable_shared_from_this<FingerprintSlots> {
 public:
  static constexpr size_t kSlotsPerChunk = 64;

  // One slot, held by one operation; frees it on destruction.
  //
  // Thread-safety: owned by one object at a time; `host()` and `device()`
  // may be read from any thread, and it may be destroyed on any thread.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    // Two int64 of pinned host memory, and two of device memory. Non-owning:
    // into the chunks of `owner_`, which this Lease keeps alive.
    int64_t* host() const {
      return host_;
    }
    int64_t* device() const {
      return device_;
    }

   private:
    friend class FingerprintSlots;
    std::shared_ptr<FingerprintSlots> owner_; // null when empty or moved from
    size_t index_ = 0;
    int64_t* host_ = nullptr;
    int64_t* device_ = nullptr;
  };

  static std::shared_ptr<FingerprintSlots> create();

  // A free slot; allocates a chunk when none is free, on `stream`'s device
  // (its device part for `stream`). Throws when the memory cannot be had.
  Lease acquire(const c10::cuda::CUDAStream& stream);

  // Keeps `slots` (and so its memory) until the process exits: for a group
  // that failed, whose aborted operations may still copy into host slots
  // that LibTorch's pinned allocator would otherwise hand to someone else.
  static void keep_until_exit(std::shared_ptr<FingerprintSlots> slots);

 private:
  struct PrivateTag {};

 public:
  explicit FingerprintSlots(PrivateTag) {}

 private:
  void release(size_t index) noexcept;

  struct Chunk {
    at::Tensor host;   // int64[2 * kSlotsPerChunk], pinned
    at::Tensor device; // int64[2 * kSlotsPerChunk]
  };
  std::mutex mutex_;
  std::vector<Chunk> chunks_; // guarded by mutex_
  std::vector<size_t> free_; // guarded by mutex_; slot i is in chunk i / kSlotsPerChunk
};

// How a tensor's elements travel through NCCL: `count` elements of `type`.
// For data movement every dtype works: one NCCL has no type for (int16,
// quantized types, ...) moves as bytes.
struct NcclLayout {
  ncclDataType_t type = ncclUint8;
  size_t count = 0;
};

// The layout of `tensor` for broadcast, gather, send and the like.
NcclLayout movement_layout(const at::Tensor& tensor);

// How a reduction runs on NCCL: its type, its operation, the number of NCCL
// elements per tensor element (2 for complex numbers, reduced as pairs of
// reals), and whether the result must be divided by the world size
// afterwards (AVG where NCCL has no ncclAvg).
struct NcclReduction {
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  size_t elements_per_value = 1;
  bool divide_after = false;

  size_t count(const at::Tensor& tensor) const {
    return static_cast<size_t>(tensor.numel()) * elements_per_value;
  }
};

// The reduction of `op` on `dtype`. Throws c10::Error, prefixed with `who`
// ("[rank R/W] allreduce"), for what NCCL cannot do: the bitwise operations,
// AVG on integers or bool, dtypes NCCL has no type for, and PRODUCT, MIN or
// MAX on complex numbers.
NcclReduction nccl_reduction(at::ScalarType dtype, ReduceOp op, const std::string& who);

// "ncclRemoteError (remote process exited or there was a network error)".
std::string nccl_result_text(ncclResult_t result);

// Throws unless `result` is ncclSuccess or ncclInProgress: RemoteError for
// ncclRemoteError, CommError otherwise, with `what` ("[rank 0/2] allreduce
// #3: ncclAllReduce") and NCCL's last error message for `comm` (may be
// null).
void check_nccl(ncclResult_t result, ncclComm_t comm, const std::string& what);

// Throws CommError naming `what` unless `error` is cudaSuccess.
void check_cuda(cudaError_t error, const std::string& what);

// Copies `bytes` bytes between device buffers on `stream`; a no-op for 0.
void copy_on_stream(void* destination, const void* source, size_t bytes, cudaStream_t stream,
                    const std::string& what);

// Sleeps a little longer on each call, from 10 us up to 1 ms: the pause of a
// loop that polls the GPU or NCCL.
//
// Thread-safety: one per polling loop, used by one thread.
class Backoff {
 public:
  void pause();

 private:
  std::chrono::microseconds next_{10};
};

} // namespace ddp::internal
