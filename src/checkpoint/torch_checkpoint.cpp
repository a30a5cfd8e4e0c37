// save_torch_checkpoint / load_torch_checkpoint (torch_format.h): the
// torch.save-format files of a DDP or FSDP job, written by rank 0.

#include <torch/torch.h>

#include <ddp/checkpoint/torch_format.h>
#include <ddp/nn/distributed_data_parallel.h>
#include <ddp/nn/fully_sharded_data_parallel.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include "checkpoint/agree.h"
#include "checkpoint/names.h"
#include "internal/check.h"

namespace ddp {

namespace {

void check_paths(const std::string& prefix, const torch::optim::Optimizer* optimizer, const std::string& optimizer_path) {
  DDP_CHECK(optimizer == nullptr || !optimizer_path.empty(), prefix,
            ": an optimizer was given without a path to save its state to");
}

} // namespace

void save_torch_checkpoint(const DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path) {
  const auto& group = model->process_group();
  const std::string prefix = checkpoint::who(*group, "save_torch_checkpoint");
  check_paths(prefix, optimizer, optimizer_path);
  if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizerBase*>(optimizer)) {
    DDP_CHECK(zero->process_group() == group, prefix,
              ": the ZeroRedundancyOptimizer shards its state over another process group than the model's");
    zero->consolidate_state_dict(0); // a collective
  }
  checkpoint::all_ranks_agree(group, prefix, [&] {
    if (group->rank() != 0) {
      return;
    }
    save_torch_state_dict(module_state_dict(*model->module()), model_path);
    if (optimizer != nullptr) {
      save_torch_optimizer_state_dict(optimizer_state_dict(*optimizer), optimizer_path);
    }
  });
}

void save_torch_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path) {
  const auto& group = model->shard_group();
  const std::string prefix = checkpoint::who(*group, "save_torch_checkpoint");
  check_paths(prefix, optimizer, optimizer_path);
  const auto options = FullStateDictOptions().rank0_only(true).offload_to_cpu(true);
  const auto state = model->full_state_dict(options); // collectives
  OptimizerStateDict optimizer_state;
  if (optimizer != nullptr) {
    optimizer_state = full_optimizer_state_dict(model, *optimizer, options);
  }
  checkpoint::all_ranks_agree(group, prefix, [&] {
    if (group->rank() != 0) {
      return;
    }
    save_torch_state_dict(state, model_path);
    if (optimizer != nullptr) {
      save_torch_optimizer_state_dict(optimizer_state, optimizer_path);
    }
  });
}

void load_torch_checkpoint(DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path,
                           const LoadStateDictOptions& options) {
  check_paths("load_torch_checkpoint", optimizer, optimizer_path);
  const auto state = load_torch_state_dict(model_path);
  OptimizerStateDict optimizer_state;
  if (optimizer != nullptr) {
    optimizer_state = load_torch_optimizer_state_dict(optimizer_path);
  }
  try {
    load_module_state_dict(*model->module(), state, options);
    if (optimizer != nullptr) {
      load_optimizer_state_dict(*optimizer, optimizer_state);
    }
  } catch (const c10::Error& e) {
    DDP_CHECK(false, "load_torch_checkpoint: '", optimizer == nullptr ? model_path : model_path + "' and '" + optimizer_path,
              "': ", e.what_without_backtrace());
  }
}

void load_torch_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer,
                           const std::string& model_path, const std::string& optimizer_path,
                           const LoadStateDictOptions& options) {
  check_paths("load_torch_checkpoint", optimizer, optimizer_path);
  DDP_CHECK(options.strict(), "load_torch_checkpoint: FullyShardedDataParallel loads whole states only (strict)");
  const auto state = load_torch_state_dict(model_path);
  OptimizerStateDict optimizer_state;
  if (optimizer != nullptr) {
    optimizer_state = load_torch_optimizer_state_dict(optimizer_path);
  }
  try {
    model->load_full_state_dict(state);
    if (optimizer != nullptr) {
      load_full_optimizer_state_dict(model, *optimizer, optimizer_state);
    }
  } catch (const c10::Error& e) {
    DDP_CHECK(false, "load_torch_checkpoint: '", optimizer == nullptr ? model_path : model_path + "' and '" + optimizer_path,
              "': ", e.what_without_backtrace());
  }
}

} // namespace ddp
