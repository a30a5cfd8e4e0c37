#pragma once

/// Deferred construction: a model larger than one rank's memory, built one
/// unit at a time under FullyShardedDataParallel, each rank keeping only
/// its shards. PyTorch builds such models on the `meta` device and has FSDP
/// materialise them; LibTorch's modules allocate in their constructors and
/// take no device to build on, so here a unit is given as a factory instead
/// (`ddp::deferred_unit`), which FSDP calls when it shards that unit: the
/// unit's full parameters exist only until this rank's shard is taken.
///
/// Initial values come from `seeded_init`: each module that holds
/// parameters is initialised from a generator seeded with the seed and its
/// name in the model, so that the values depend on neither the order the
/// modules are built in nor which rank builds them. A model built whole
/// and `seeded_init`ed, and the same model built unit by unit under FSDP
/// with the same `ParamInit`, hold the same values bit for bit.
///
/// ```
/// struct NetImpl : torch::nn::Module {
///   NetImpl() {
///     for (int i = 0; i < 48; ++i) {
///       blocks.push_back(register_module("block" + std::to_string(i),
///                                        ddp::deferred_unit([] { return Block(); })));
///     }
///   }
///   ...
/// };
/// ddp::FullyShardedDataParallel model(Net(), ddp::FullyShardedDataParallelOptions()
///     .param_init(ddp::ParamInit().seed(1234)));
/// ```
/// Without FSDP (DDP, one process), `ddp::materialize(net, ddp::ParamInit().seed(1234))`
/// builds every deferred unit of `net` in place.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

#include <ddp/nn/fully_sharded_data_parallel.h>

namespace ddp {

/// ModuleInit, reset_parameters and ParamInit are in fully_sharded_data_parallel.h.

/// Initialises every module of `module` that holds parameters or buffers
/// of its own, each from the default CPU generator seeded with
/// (options.seed(), its name), then puts the generator back as it was.
/// Names are state dicts' (FsdpUnit and Checkpointed levels left out),
/// under `prefix`. Parameters on a GPU are initialised on the CPU and
/// copied back. Deferred units not yet built are skipped.
void seeded_init(torch::nn::Module& module, const ParamInit& options, const std::string& prefix = "");

/// Builds every deferred unit of `module` (whole: for a model trained
/// without FSDP), `seeded_init`s all of `module`, as FullyShardedDataParallel
/// with `param_init` does, and moves what it built to options.device().
void materialize(torch::nn::Module& module, const ParamInit& options);

/// A unit whose module `factory` (a callable returning a module holder,
/// `[] { return Block(); }`) builds when FullyShardedDataParallel shards
/// it, or `materialize` builds it: until then it holds no parameters.
/// Under FSDP it needs FullyShardedDataParallelOptions().param_init(...).
template <typename Factory>
FsdpUnit deferred_unit(Factory factory) {
  return FsdpUnit(FsdpUnitImpl::Deferred{[factory] { return torch::nn::AnyModule(factory()); }});
}

} // namespace ddp
