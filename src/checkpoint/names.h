#pragma once

// A module's parameters and buffers with the names PyTorch gives them
// (private header): module_state_dict, the FSDP state dicts and DCP all
// name tensors through here, so that every format uses the same names.

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include <ddp/checkpoint/state_dict.h>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace ddp::checkpoint {

struct NamedTensor {
  std::string name;     // PyTorch's: no FsdpUnit "module" level
  std::string raw_name; // LibTorch's named_parameters()/named_buffers() name
  at::Tensor tensor;
  bool parameter;
};

// Module by module: a module's own parameters, then its own buffers, then
// its children's, as Python's state_dict() orders them. A tensor held by
// two modules appears under both names.
std::vector<NamedTensor> named_state(const torch::nn::Module& module);

// PyTorch's name of the tensor LibTorch names `raw` in `module`, or `raw`.
std::string clean_name(const torch::nn::Module& module, const std::string& raw);

// `state` matched against `module`'s tensors by PyTorch's names, or by
// LibTorch's raw names (a FsdpUnit's "module" level, as earlier ddp saved
// them: accepted with a warning). Each tensor's expected shape is
// `shape_of(item)`. Checks everything and throws c10::Error starting with
// `who` listing every problem: a shape that differs always, a missing or
// unexpected key under `strict`. Found values are keyed by raw name.
struct ResolvedState {
  StateDict by_raw;
  IncompatibleKeys keys;
};
ResolvedState resolve_state(const torch::nn::Module& module, const StateDict& state, const std::string& who,
                            bool strict, const std::function<std::vector<int64_t>(const NamedTensor&)>& shape_of);

} // namespace ddp::checkpoint
