#pragma once

// Every difference between the LibTorch versions ddp builds against (1.13
// from Debian, 2.x from PyPI) is named here, once, so that the rest of the
// code tests a feature, never a version number (private header).
//
// Differences between the Gloo versions (Debian's 2022 one; the newer one of
// the private build) are absorbed where Gloo is called, by letting the
// compiler take a Gloo function's own type (src/comm/gloo/), not here.

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <sstream>
#include <type_traits>
#include <utility>

// True when the LibTorch being compiled against is `major.minor` or newer.
#define DDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||      \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// at::ScalarType::Float8_e4m3fn and Float8_e5m2 exist (LibTorch 2.1).
#define DDP_TORCH_HAS_FLOAT8 DDP_TORCH_AT_LEAST(2, 1)

// at::ScalarType::UInt32 and UInt64 exist (LibTorch 2.3).
#define DDP_TORCH_HAS_UINT32_UINT64 DDP_TORCH_AT_LEAST(2, 3)

// at::Allocator::allocate is const in LibTorch 1.13 and not in 2.11, where
// an allocator also implements copy_data (checked against both; the change
// came between them, with 2.3's copy-on-write storage).
#if DDP_TORCH_AT_LEAST(2, 3)
#define DDP_ALLOCATOR_ALLOCATE_CONST
#define DDP_TORCH_ALLOCATOR_HAS_COPY_DATA 1
#else
#define DDP_ALLOCATOR_ALLOCATE_CONST const
#define DDP_TORCH_ALLOCATOR_HAS_COPY_DATA 0
#endif

namespace ddp::internal {

// The owning pointer to an autograd Node (a parameter's gradient
// accumulator): std::shared_ptr up to LibTorch 2.11, c10::intrusive_ptr in
// newer ones (2.15 has it). Both compare with == and test with bool.
using AutogradNodePtr = std::decay_t<decltype(torch::autograd::impl::grad_accumulator(
    std::declval<const at::Tensor&>()))>;

// The key of `param` in an optimizer's state map (Optimizer::state()):
// LibTorch 1.13 keys it by the TensorImpl's address printed as a string,
// 2.x by the address itself.
template <typename Map>
typename Map::key_type state_key(const Map& /*map*/, const at::Tensor& param) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream text;
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

} // namespace ddp::internal
