#pragma once

/// State dicts in torch.save's format, both ways: files that Python's
/// `torch.load(path, weights_only=True)` opens and `model.load_state_dict` /
/// `optimizer.load_state_dict` accept (PyTorch 1.13 to 2.11), and files
/// that Python's `torch.save(model.state_dict(), path)` /
/// `torch.save(optimizer.state_dict(), path)` wrote, read into C++. See
/// docs/ddp.md, "Moving checkpoints between C++ and Python".
///
/// ```
/// // C++, rank 0 of a DDP job (save_torch_checkpoint does it on every rank):
/// ddp::save_torch_state_dict(ddp::module_state_dict(*model->module()), "model.pt");
/// // Python:
/// net.load_state_dict(torch.load("model.pt", weights_only=True))
/// ```

#include <string>

#include <ddp/checkpoint/state_dict.h>

namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace ddp {

class DistributedDataParallel;
class FullyShardedDataParallel;

/// `torch.save(state, path)` of a module's state dict (an OrderedDict of
/// tensors, each on the device it is on, as torch.save writes them).
/// Atomic: written under a temporary name, fsync'ed and renamed into place.
/// Throws c10::Error naming the file when it cannot be written.
void save_torch_state_dict(const StateDict& state, const std::string& path);

/// `torch.load(path, map_location="cpu")` of a state dict: a dict (or
/// OrderedDict) of tensors, or with `key`, the dict stored under `key` of
/// the file's dict (`torch.save({"model": model.state_dict(), ...})`).
/// Throws c10::Error naming the file and what is wrong: not a torch.save
/// file, truncated or damaged, a value that is not a tensor.
StateDict load_torch_state_dict(const std::string& path, const std::string& key = "");

/// `torch.save(optimizer.state_dict(), path)`, PyTorch's layout (atomic).
void save_torch_optimizer_state_dict(const OptimizerStateDict& state, const std::string& path);

/// An optimizer's state dict written by `torch.save(optimizer.state_dict())`
/// (or one of save_torch_optimizer_state_dict), optionally under `key`.
/// States keyed by parameter name (as FSDP's optim_state_dict writes them)
/// are numbered in the order the groups list the names, which are kept in
/// `param_names`. Throws c10::Error naming the file and the problem.
OptimizerStateDict load_torch_optimizer_state_dict(const std::string& path, const std::string& key = "");

/// Saves a DistributedDataParallel model's state dict to `model_path` and,
/// when `optimizer` is not null, its state dict to `optimizer_path`, in
/// torch.save's format: rank 0 writes, every rank waits. A
/// ZeroRedundancyOptimizer is consolidated on rank 0 first. A collective;
/// every rank throws c10::Error when rank 0 cannot write.
void save_torch_checkpoint(const DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path = "");

/// The same for FullyShardedDataParallel: the full state dict and the full
/// optimizer state dict (the shards' states joined into each parameter's),
/// gathered on rank 0, which writes them. A collective.
void save_torch_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path = "");

/// Loads files of save_torch_checkpoint, or of Python's torch.save of a
/// model's and an optimizer's state dicts, into `model` (and `optimizer`
/// when not null), on every rank. Not a collective: every rank reads the
/// files. Checks everything before changing anything; throws c10::Error
/// naming the file and the problem.
void load_torch_checkpoint(DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path = "",
                           const LoadStateDictOptions& options = {});
void load_torch_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path = "",
                           const LoadStateDictOptions& options = {});

} // namespace ddp
