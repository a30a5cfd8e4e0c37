// FullyShardedDataParallel's full states (gathered from the shards, loaded
// back into them) and gradient clipping over the shards.

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include <ddp/nn/fully_sharded_data_parallel.h>

#include "checkpoint/names.h"
#include "fsdp/fsdp_state.h"
#include "internal/check.h"

namespace ddp {

namespace {

using StateDict = torch::OrderedDict<std::string, at::Tensor>;

} // namespace

StateDict FullyShardedDataParallelImpl::full_state_dict(const FullStateDictOptions& options) {
  State& s = *state_;
  DDP_CHECK(!s.in_forward, s.config.who, ": full_state_dict called during forward");
  const bool keep = !options.rank0_only() || s.group->rank() == 0;
  std::vector<at::Tensor> fulls;
  for (auto& unit : s.units) {
    fulls.push_back(unit->gather_full_copy()); // a collective: every rank, in unit order
  }
  StateDict state;
  if (!keep) {
    return state;
  }
  torch::NoGradGuard no_grad;
  auto place = [&](at::Tensor value) { return options.offload_to_cpu() ? value.to(torch::kCPU) : value; };
  // PyTorch's names and order (no FsdpUnit level), as module_state_dict.
  for (const auto& item : checkpoint::named_state(*module_)) {
    if (state.contains(item.name)) {
      continue;
    }
    if (!item.parameter) {
      state.insert(item.name, place(item.tensor.detach().clone()));
      continue;
    }
    const auto found = s.where.find(item.raw_name);
    DDP_INTERNAL_ASSERT(found != s.where.end(), "parameter ", item.raw_name, " is in no unit");
    const auto& entry = s.units[found->second.first]->entries()[found->second.second];
    state.insert(item.name,
                 place(fulls[found->second.first].narrow(0, entry.offset, entry.numel).view(entry.shape).clone()));
  }
  return state;
}

void FullyShardedDataParallelImpl::load_full_state_dict(const StateDict& state) {
  State& s = *state_;
  DDP_CHECK(!s.in_forward, s.config.who, ": load_full_state_dict called during forward");
  // The parameters hold no storage outside forward: their shapes are the
  // units' entries'.
  const auto resolved = checkpoint::resolve_state(
      *module_, state, s.config.who + " load_full_state_dict", /*strict=*/true,
      [&](const checkpoint::NamedTensor& item) {
        if (!item.parameter) {
          return item.tensor.sizes().vec();
        }
        const auto found = s.where.find(item.raw_name);
        DDP_INTERNAL_ASSERT(found != s.where.end(), "parameter ", item.raw_name, " is in no unit");
        return s.units[found->second.first]->entries()[found->second.second].shape;
      });
  torch::NoGradGuard no_grad;
  for (auto& unit : s.units) {
    auto full = torch::zeros({unit->padded_numel()}, unit->shard().options().requires_grad(false));
    for (const auto& entry : unit->entries()) {
      full.narrow(0, entry.offset, entry.numel).copy_(resolved.by_raw[entry.name].reshape({-1}));
    }
    unit->load_full(full);
  }
  for (auto& item : module_->named_buffers()) {
    item.value().copy_(resolved.by_raw[item.key()]);
  }
}

double FullyShardedDataParallelImpl::clip_grad_norm(double max_norm, double norm_type) {
  State& s = *state_;
  DDP_CHECK(norm_type > 0, s.config.who, ": clip_grad_norm: norm_type must be positive (got ", norm_type, ")");
  const bool infinite = std::isinf(norm_type);
  torch::NoGradGuard no_grad;
  double local = 0;
  c10::Device device(c10::kCPU);
  for (auto& unit : s.units) {
    const auto& grad = unit->shard().grad();
    device = unit->device(); // an offloaded shard's collectives run on its GPU
    if (!grad.defined()) {
      continue;
    }
    if (infinite) {
      local = std::max(local, grad.abs().max().item<double>());
    } else {
      local += grad.to(torch::kDouble).abs().pow(norm_type).sum().item<double>();
    }
  }
  // Each shard group holds the whole model once (replicate groups hold copies).
  double total = local;
  const auto& shards = s.config.shard_group;
  if (shards && shards->size() > 1) {
    auto value = torch::tensor({local}, torch::kDouble).to(device);
    shards->allreduce(value, AllreduceOptions{infinite ? ReduceOp::kMax : ReduceOp::kSum})->wait();
    total = value.cpu().item<double>();
  }
  const double norm = infinite ? total : std::pow(total, 1.0 / norm_type);
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1) {
    for (auto& unit : s.units) {
      auto& grad = unit->shard().mutable_grad();
      if (grad.defined()) {
        grad.mul_(coefficient);
      }
    }
  }
  return norm;
}

void load_full_state_dict(torch::nn::Module& module, const StateDict& state) {
  load_module_state_dict(module, state);
}

StateDict full_state_dict_of(const torch::nn::Module& module) {
  StateDict state;
  torch::NoGradGuard no_grad;
  for (const auto& item : module_state_dict(module)) {
    state.insert(item.key(), item.value().clone());
  }
  return state;
}

} // namespace ddp
