#pragma once

// The per-type mapping between LibTorch's optimizer states and PyTorch's
// (private header; optimizer_state.cpp). Used by the optimizer state dicts
// and by DCP, which keys the same tensors by parameter name.

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::checkpoint {

enum class OptimizerKind { kAdam, kAdamW, kSGD, kRMSprop, kAdagrad };

// The kind of `optimizer` (a ZeroRedundancyOptimizer's: the wrapped one's).
// Throws c10::Error for another type.
OptimizerKind kind_of(const torch::optim::Optimizer& optimizer);
const char* name_of(OptimizerKind kind);

// A parameter's state by PyTorch's names; "step" a 0-d float32 tensor.
torch::OrderedDict<std::string, at::Tensor> export_param_state(const torch::optim::OptimizerParamState& state);

// A group's options by PyTorch 2.11's names, in its order ('params' apart).
std::vector<std::pair<std::string, c10::IValue>> export_options(const torch::optim::OptimizerOptions& options);

// Sets `options` from PyTorch's names; unknown names are ignored, options
// LibTorch cannot honour refused. Throws c10::Error starting with `who`.
void import_options(torch::optim::OptimizerOptions& options,
                    const std::vector<std::pair<std::string, c10::IValue>>& values, const std::string& who);

// A LibTorch state for `param` from PyTorch's names, the tensors copied to
// the parameter's device and dtype; nullptr where LibTorch keeps none (SGD
// without a momentum buffer). `options` are the parameter's group's.
// Throws c10::Error starting with `who` for a missing, unknown or
// misshapen tensor.
std::unique_ptr<torch::optim::OptimizerParamState> import_param_state(
    OptimizerKind kind, const torch::optim::OptimizerOptions& options,
    const torch::OrderedDict<std::string, at::Tensor>& values, const at::Tensor& param, const std::string& who);

// Sets the step of a state that has one (all but SGD's).
void set_step(torch::optim::OptimizerParamState& state, int64_t step);

// `param`'s entry in `optimizer.state()`: set (nullptr erases), or read.
void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                     std::unique_ptr<torch::optim::OptimizerParamState> state);
const torch::optim::OptimizerParamState* param_state(const torch::optim::Optimizer& optimizer,
                                                     const at::Tensor& param);

} // namespace ddp::checkpoint
