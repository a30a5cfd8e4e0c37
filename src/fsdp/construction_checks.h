#pragma once

// What FullyShardedDataParallel checks across ranks at construction besides
// the units (comm/objects/same_on_every_rank.h): that every rank holds the
// same initial values. Private.

#include <torch/nn/module.h>

#include <c10/core/Device.h>

#include <string>

#include <ddp/comm/process_group.h>

namespace ddp::fsdp {

// Every rank's parameters and buffers hold the same values (a checksum of
// each: a hash of its bytes), or every rank throws naming the first that
// differs: FSDP, unlike DDP, broadcasts nothing, and shards of models
// initialised apart would train a mix of them. A collective; the tensors
// are read one at a time (each copied to the host when on a GPU).
void check_same_values(const torch::nn::Module& module, ProcessGroup& group, const c10::Device& device,
                       const std::string& who);

} // namespace ddp::fsdp
