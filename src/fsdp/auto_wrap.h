#pragma once

// FullyShardedDataParallel's auto-wrap (AutoWrapPolicy in
// fully_sharded_data_parallel.h): units put around the children of the
// model's Sequentials that a policy chooses. Private.

#include <torch/nn/module.h>

#include <string>

#include <ddp/nn/fully_sharded_data_parallel.h>

namespace ddp::fsdp {

// Visits `module` (at `path`) bottom-up and, in each Sequential below or at
// it, replaces each child that the policy chooses and that holds no unit
// by a unit around it (in the Sequential's call list and in its registered
// children, under the same name). An explicit FsdpUnit is left as it is,
// and nothing inside it is visited. Returns whether `module` holds a unit
// afterwards (is one, or has one below it). FSDP calls it on a Sequential
// model's children, which it drives itself, and on a custom model.
bool auto_wrap(torch::nn::Module& module, const std::string& path, const AutoWrapPolicy& policy);

// How many parameter elements `module` holds.
int64_t parameter_numel(const torch::nn::Module& module);

} // namespace ddp::fsdp
