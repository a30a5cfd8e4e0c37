#pragma once

/// torch.distributed.checkpoint (DCP) directories, read and written from
/// C++: every rank writes the pieces of the model and optimizer state it
/// holds (`__<rank>_<n>.distcp`), rank 0 the `.metadata` that names them,
/// in the layout PyTorch 2.11's `torch.distributed.checkpoint` writes for
/// `{"model": ..., "optim": ...}` as `get_state_dict(model, optimizer)`
/// gives them. Loading reads, on each rank, whatever saved pieces overlap
/// what the rank holds: a checkpoint written at any world size loads at any
/// other, by DDP, ZeroRedundancyOptimizer and FullyShardedDataParallel alike
/// (a DDP checkpoint resumes as FSDP), and by Python's dcp.load.
///
/// ```
/// ddp::dcp::save(model, optimizer, "ckpt/step-1000");   // every rank
/// ddp::dcp::load(model, optimizer, "ckpt/step-1000");   // every rank, any world size
/// ```
/// See docs/ddp.md, "Moving checkpoints between C++ and Python".

#include <memory>
#include <string>

#include <ddp/checkpoint/state_dict.h>
#include <ddp/comm/process_group.h>

namespace torch::nn {
class Module;
} // namespace torch::nn
namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace ddp {
class DistributedDataParallel;
class FullyShardedDataParallel;
} // namespace ddp

namespace ddp::dcp {

/// Options of `load`.
struct LoadOptions {
  /// Refuse a checkpoint that lacks a tensor the model has, or holds model
  /// or optimizer state the model lacks (PyTorch's `strict`); with false,
  /// what is missing keeps its value and load returns what did not match.
  /// Default: true.
  TORCH_ARG(bool, strict) = true;
};

/// Saves `model` (and `optimizer`'s state, when not null: a plain LibTorch
/// Adam, AdamW, SGD, RMSprop or Adagrad, or a ZeroRedundancyOptimizer of
/// one) to the directory `path`, creating it. A collective of the model's
/// group: every rank writes its part (a piece held by several ranks, as
/// DDP's replicas, is written by one of them), then rank 0 commits.
/// Atomic: the previous checkpoint in `path` stays readable until the new
/// `.metadata` is renamed into place, and its files are removed after; a
/// killed save leaves the previous one loadable. Every rank throws
/// c10::Error when any rank fails, naming it.
void save(const DistributedDataParallel& model, const std::string& path);
void save(const DistributedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path);
void save(FullyShardedDataParallel& model, const std::string& path);
void save(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path);

/// Loads the checkpoint at `path` into `model` (and `optimizer`): each rank
/// reads the saved pieces that overlap what it holds, whatever world size
/// and wrapper wrote them. The optimizer gets the options of each group and
/// the state of each parameter the checkpoint has one for (the others have
/// none after, as PyTorch's load_state_dict leaves them). A collective:
/// every rank checks everything first (keys, shapes, dtypes, groups, that
/// every needed piece and file is there), and throws c10::Error naming the
/// file and the key, on every rank, before any value changes; a file
/// damaged inside fails the load on every rank too, the model's values then
/// partly loaded. Returns the keys that did not match (non-strict only).
IncompatibleKeys load(DistributedDataParallel& model, const std::string& path, const LoadOptions& options = {});
IncompatibleKeys load(DistributedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path,
                      const LoadOptions& options = {});
IncompatibleKeys load(FullyShardedDataParallel& model, const std::string& path, const LoadOptions& options = {});
IncompatibleKeys load(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer, const std::string& path,
                      const LoadOptions& options = {});

/// A plain module (and optimizer, or nullptr) replicated over `group`, or
/// in this process alone when `group` is nullptr: e.g. to read a checkpoint
/// of a 4-rank job into one process for evaluation.
void save(torch::nn::Module& module, torch::optim::Optimizer* optimizer, const std::string& path,
          const std::shared_ptr<ProcessGroup>& group = nullptr);
IncompatibleKeys load(torch::nn::Module& module, torch::optim::Optimizer* optimizer, const std::string& path,
                      const std::shared_ptr<ProcessGroup>& group = nullptr, const LoadOptions& options = {});

/// The model's full state of the checkpoint at `path`, assembled in this
/// process (no process group): for safetensors or a single file.
StateDict read_model_state(const std::string& path);

} // namespace ddp::dcp
