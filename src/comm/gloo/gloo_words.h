#pragma once

// Handing tensors to Gloo's algorithms (private header): Gloo is typed on
// its element type, ddp's tensors are not.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

namespace ddp::internal {

// Gloo algorithms only need the element size, so every dtype moves as
// unsigned words of its size: `set` gets the tensor's data as a pointer to
// such words, and its element count.
template <typename Set>
inline void as_words(const at::Tensor& tensor, Set&& set) {
  void* data = tensor.data_ptr();
  const size_t count = static_cast<size_t>(tensor.numel());
  switch (tensor.element_size()) {
    case 1:
      set(static_cast<uint8_t*>(data), count);
      break;
    case 2:
      set(static_cast<uint16_t*>(data), count);
      break;
    case 4:
      set(static_cast<uint32_t*>(data), count);
      break;
    default:
      set(static_cast<uint64_t*>(data), count);
      break;
  }
}

template <typename Options>
inline void set_output(Options& options, const at::Tensor& tensor) {
  as_words(tensor, [&options](auto* data, size_t count) { options.setOutput(data, count); });
}

template <typename Options>
inline void set_input(Options& options, const at::Tensor& tensor) {
  as_words(tensor, [&options](auto* data, size_t count) { options.setInput(data, count); });
}

} // namespace ddp::internal
