// FullyShardedDataParallel's pool of freed blocks; see buffer_pool.h.

#include "fsdp/buffer_pool.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include <utility>

namespace ddp::fsdp {

at::DataPtr BufferPool::pop(const c10::Device& device, size_t bytes) {
  const auto found = blocks_.find(Key{static_cast<int>(device.type()), device.index(), bytes});
  if (found == blocks_.end() || found->second.empty()) {
    return c10::GetAllocator(device.type())->allocate(bytes);
  }
  at::DataPtr block = std::move(found->second.back());
  found->second.pop_back();
  pooled_bytes_ -= bytes;
  return block;
}

at::Tensor BufferPool::take(int64_t numel, const at::TensorOptions& options) {
  const auto bytes = static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  const c10::Device device = options.device();
  if (bytes == 0) {
    return at::empty({numel}, options);
  }
  at::Storage storage(at::Storage::use_byte_size_t(), bytes, pop(device, bytes),
                      c10::GetAllocator(device.type()), /*resizable=*/false);
  return at::empty({0}, options).set_(storage, 0, {numel}, {1});
}

void BufferPool::fill(c10::StorageImpl& storage, size_t bytes) {
  storage.set_data_ptr_noswap(pop(storage.device(), bytes));
  storage.set_nbytes(bytes);
}

void BufferPool::drain(c10::StorageImpl& storage) {
  const size_t bytes = storage.nbytes();
  const c10::Device device = storage.device();
  at::DataPtr block = storage.set_data_ptr(at::DataPtr(nullptr, device));
  storage.set_nbytes(0);
  if (block.get() == nullptr || bytes == 0 || pooled_bytes_ + bytes > max_bytes_) {
    return; // freed here
  }
  pooled_bytes_ += bytes;
  blocks_[Key{static_cast<int>(device.type()), device.index(), bytes}].push_back(std::move(block));
}

void BufferPool::recycle(at::Tensor& tensor) {
  if (tensor.defined() && tensor.use_count() == 1 && tensor.storage().use_count() == 1) {
    drain(*tensor.storage().unsafeGetStorageImpl());
  }
  tensor = at::Tensor();
}

} // namespace ddp::fsdp
