#include "comm/mpi/mpi_packing.h"

#include <ATen/ATen.h>

namespace ddp::internal::mpi {

int64_t total_numel(const std::vector<at::Tensor>& tensors) {
  int64_t numel = 0;
  for (const auto& t : tensors) {
    numel += t.numel();
  }
  return numel;
}

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

at::Tensor separate_input(const at::Tensor& input, const at::Tensor& output) {
  if (input.numel() > 0 && input.is_same(output)) {
    return input.clone();
  }
  if (input.has_storage() && output.has_storage() &&
      input.storage().unsafeGetStorageImpl() == output.storage().unsafeGetStorageImpl()) {
    return input.clone();
  }
  return input;
}

at::Tensor packed_on_host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) {
    views.push_back(t.reshape({-1}));
  }
  return at::cat(views).cpu();
}

at::Tensor inputs_on_host(const std::vector<at::Tensor>& inputs, const at::Tensor& output) {
  const at::Tensor* first = nullptr;
  const char* next = nullptr;
  int64_t total = 0;
  for (const auto& t : inputs) {
    if (t.numel() == 0) {
      continue;
    }
    const auto* data = static_cast<const char*>(t.data_ptr());
    if (!t.device().is_cpu() || !t.is_contiguous() || t.is_alias_of(output) ||
        (first != nullptr && (!t.is_alias_of(*first) || data != next))) {
      return packed_on_host(inputs);
    }
    if (first == nullptr) {
      first = &t;
    }
    next = data + t.nbytes();
    total += t.numel();
  }
  if (first == nullptr) {
    return packed_on_host(inputs);
  }
  return at::empty({0}, first->options())
      .set_(first->storage(), first->storage_offset(), {total}, {1});
}

void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (const auto& t : outputs) {
    t.view({-1}).copy_(flat.narrow(0, offset, t.numel()));
    offset += t.numel();
  }
}

} // namespace ddp::internal::mpi
