#pragma once

/// Saving and loading a DistributedDataParallel model, the way PyTorch's DDP
/// tutorial does it: rank 0 writes, everyone waits at a barrier, every rank
/// loads onto its own device.

#include <string>

#include <ddp/nn/distributed_data_parallel.h>

namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace ddp {

/// Rank 0 saves the wrapped module's parameters and buffers to `path`, then
/// every rank waits at a barrier. A communication hook with a state
/// (`comm_hooks::with_state`: PowerSGD's, post-local SGD's) has every rank's
/// state saved in the same file; `load_checkpoint` restores it into the
/// hook registered at that time. The names carry no wrapper prefix: a plain
/// single-process program reads the file with `torch::load(net, path)`.
/// Atomic: the file is written under a temporary name, flushed to disk and
/// renamed into place, so a crash leaves the old checkpoint or the new one,
/// never a part; the temporary files of a killed save are removed by the
/// next save to `path`. A `path + ".optimizer"` left by an earlier save with
/// an optimizer is removed. Collective: call on every rank. Throws
/// c10::Error on every rank when rank 0 cannot write.
void save_checkpoint(const DistributedDataParallel& model, const std::string& path);

/// As above, and also saves `optimizer`'s state to `path + ".optimizer"`
/// (what `torch::save(optimizer, ...)` writes). The pair is replaced
/// atomically: `path` is written last and names the optimizer state that
/// belongs to it (its size and checksum), so that a crash at any point
/// leaves a pair from one save, the old one or the new one, which
/// load_checkpoint can read. See docs/ddp.md, "Checkpoints".
void save_checkpoint(const DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                     const std::string& path);

/// Every rank loads `path` into the wrapped module, onto the device its
/// parameters live on. Not a collective; all ranks read the same file.
/// Reads files of save_checkpoint and of `torch::save(module, path)`.
/// Throws c10::Error naming the file when it cannot be read.
void load_checkpoint(DistributedDataParallel& model, const std::string& path);

/// As above, and also loads `optimizer`'s state from `path + ".optimizer"`.
/// Refuses, with a c10::Error and before changing the model, an optimizer
/// file that is missing or was not written by the same save as `path`, and
/// a `path` saved without an optimizer. (A checkpoint written by an older
/// ddp, which names no optimizer state, is loaded unchecked.)
void load_checkpoint(DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                     const std::string& path);

} // namespace ddp
