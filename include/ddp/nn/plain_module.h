#pragma once

/// Modules that no ModuleHolder holds, as PyTorch's C++ examples write them
/// (`struct Net : torch::nn::Module`, made with std::make_shared or held by
/// value): what DistributedDataParallel and FullyShardedDataParallel need
/// to take them as they take a holder.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <type_traits>

namespace ddp::detail {

/// `module` as a holder: shared with its owner when it was made by
/// std::make_shared, else (an object on the stack, a member) referenced
/// without ownership, so that it must outlive whatever holds the holder.
template <typename ModuleType>
torch::nn::ModuleHolder<ModuleType> hold(ModuleType& module) {
  if (auto owner = module.weak_from_this().lock()) {
    return torch::nn::ModuleHolder<ModuleType>(std::static_pointer_cast<ModuleType>(owner));
  }
  return torch::nn::ModuleHolder<ModuleType>(std::shared_ptr<ModuleType>(std::shared_ptr<ModuleType>(), &module));
}

/// True for a torch::nn::Module type (not a holder), other than `Wrapper`
/// and those derived from it.
template <typename ModuleType, typename Wrapper>
constexpr bool is_plain_module_v =
    std::is_base_of_v<torch::nn::Module, ModuleType> && !std::is_base_of_v<Wrapper, ModuleType>;

} // namespace ddp::detail
