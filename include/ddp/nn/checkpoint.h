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

/// Rank 0 saves the wrapped module's parameters and buffers to `path`
/// (written to a temporary file in the same directory, then renamed, so a
/// crash never leaves half a file), then every rank waits at a barrier. The
/// names carry no wrapper prefix: a plain single-process program reads the
/// file with `torch::load(net, path)`. Collective: call on every rank.
void save_checkpoint(const DistributedDataParallel& model, const std::string& path);

/// As above, and also saves `optimizer`'s state to `path + ".optimizer"`.
void save_checkpoint(const DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                     const std::string& path);

/// Every rank loads `path` into the wrapped module, onto the device its
/// parameters live on. Not a collective; all ranks read the same file.
void load_checkpoint(DistributedDataParallel& model, const std::string& path);

/// As above, and also loads `optimizer`'s state from `path + ".optimizer"`.
void load_checkpoint(DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                     const std::string& path);

} // namespace ddp
