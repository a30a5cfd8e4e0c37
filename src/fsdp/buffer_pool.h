#pragma once

// Memory that FullyShardedDataParallel's units hand to each other (private
// header). On the CPU, LibTorch takes a large tensor's memory from the
// system (mmap) and gives it back when the tensor goes; under kFullShard
// every unit gathers and frees its parameters twice a step, and each
// backward makes a unit-sized gradient buffer: the fresh pages alone cost
// about as much as copying the data. The pool keeps freed blocks, by
// device and size, up to a byte budget, and the next gather or reduction
// of that size takes one. (On CUDA the caching allocator does the same; the
// pool is harmless there.)
//
// Thread-safety: none; used from the training thread and the autograd
// engine's thread, which do not run at the same time.

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace ddp::fsdp {

class BufferPool {
 public:
  explicit BufferPool(size_t max_bytes) : max_bytes_(max_bytes) {}

  // A contiguous 1-d tensor of `numel` elements (not initialised), in a
  // pooled block when one of its size is free.
  at::Tensor take(int64_t numel, const at::TensorOptions& options);

  // Gives `storage` memory of `bytes` bytes: a pooled block, or a new one.
  void fill(c10::StorageImpl& storage, size_t bytes);

  // Takes `storage`'s memory into the pool (or frees it when the pool is
  // full), leaving the storage with none (0 bytes).
  void drain(c10::StorageImpl& storage);

  // Pools `tensor`'s memory when nothing else uses it (no other handle,
  // view or storage user), and resets `tensor`.
  void recycle(at::Tensor& tensor);

 private:
  using Key = std::tuple<int, int, size_t>; // device type, index, bytes
  at::DataPtr pop(const c10::Device& device, size_t bytes);

  size_t max_bytes_;
  size_t pooled_bytes_ = 0;
  std::map<Key, std::vector<at::DataPtr>> blocks_;
};

} // namespace ddp::fsdp
