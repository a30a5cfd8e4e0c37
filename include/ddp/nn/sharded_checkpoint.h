#pragma once

/// Checkpoints of a FullyShardedDataParallel model in which every rank
/// writes its own shards (PyTorch's SHARDED_STATE_DICT with
/// torch.distributed.checkpoint): no rank ever holds the whole model. The
/// files of one save form a set that is replaced atomically: a crash at any
/// point leaves the previous save or the new one, never a mix. See
/// docs/ddp.md, "Fully sharded data parallel".

#include <torch/ordered_dict.h>

#include <string>

#include <ddp/nn/fully_sharded_data_parallel.h>

namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace ddp {

/// Every rank writes its shards, its copy of the buffers and (when given)
/// its optimizer's state over its shards to PATH.<save id>.rank<R>; then
/// rank 0 writes PATH, the manifest that names the set (world size, each
/// file's size and checksum, the units' layout) and is the commit point.
/// Files of earlier saves are removed after the commit. A collective; every
/// rank throws c10::Error when one of them cannot write.
void save_sharded_checkpoint(FullyShardedDataParallel& model, const std::string& path);
void save_sharded_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                             const std::string& path);

/// Every rank reads its own file of the set PATH names, checked against the
/// manifest, into its shards and buffers (and optimizer). The checkpoint
/// must have been written on as many ranks, with the same units; on another
/// world size, load `read_sharded_checkpoint_full(path)` with
/// `load_full_state_dict` (the optimizer state then starts afresh). Not a
/// collective. Throws c10::Error naming the file and the problem.
void load_sharded_checkpoint(FullyShardedDataParallel& model, const std::string& path);
void load_sharded_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                             const std::string& path);

/// How many ranks wrote the sharded checkpoint at PATH (from its manifest):
/// load_sharded_checkpoint needs as many. Throws c10::Error when PATH is
/// not a sharded checkpoint's manifest.
int sharded_checkpoint_world_size(const std::string& path);

/// The full state (parameters and buffers by name, as `full_state_dict()`)
/// of the sharded checkpoint at PATH, assembled in this process from every
/// rank's file: for another world size, or for a plain module
/// (`load_full_state_dict(module, state)`). Needs no process group.
torch::OrderedDict<std::string, at::Tensor> read_sharded_checkpoint_full(const std::string& path);

} // namespace ddp
