// FullyShardedDataParallel's full states (gathered from the shards, loaded
// back into them) and gradient clipping over the shards.

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <set>

#include <ddp/nn/fully_sharded_data_parallel.h>

#include "fsdp/fsdp_state.h"
#include "internal/check.h"

namespace ddp {

namespace {

using StateDict = torch::OrderedDict<std::string, at::Tensor>;

// Checks that `state` holds exactly the tensors `expected` names, with the
// shapes given; throws naming every problem before anything is changed.
void check_state(const std::string& who, const StateDict& state,
                 const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected) {
  std::vector<std::string> problems;
  std::set<std::string> known;
  for (const auto& [name, shape] : expected) {
    known.insert(name);
    const auto* value = state.find(name);
    if (value == nullptr) {
      problems.push_back("missing " + name);
    } else if (value->sizes().vec() != shape) {
      problems.push_back(c10::str(name, " has shape ", value->sizes(), ", expected ", at::IntArrayRef(shape)));
    }
  }
  for (const auto& item : state) {
    if (known.count(item.key()) == 0) {
      problems.push_back("unexpected " + item.key());
    }
  }
  if (!problems.empty()) {
    std::string text;
    for (const auto& problem : problems) {
      text += (text.empty() ? "" : "; ") + problem;
    }
    DDP_CHECK(false, who, ": the state does not fit the model: ", text);
  }
}

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
  for (const auto& item : module_->named_parameters()) {
    const auto found = s.where.find(item.key());
    DDP_INTERNAL_ASSERT(found != s.where.end(), "parameter ", item.key(), " is in no unit");
    const auto& entry = s.units[found->second.first]->entries()[found->second.second];
    state.insert(item.key(),
                 place(fulls[found->second.first].narrow(0, entry.offset, entry.numel).view(entry.shape).clone()));
  }
  for (const auto& item : module_->named_buffers()) {
    state.insert(item.key(), place(item.value().detach().clone()));
  }
  return state;
}

void FullyShardedDataParallelImpl::load_full_state_dict(const StateDict& state) {
  State& s = *state_;
  DDP_CHECK(!s.in_forward, s.config.who, ": load_full_state_dict called during forward");
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& item : module_->named_parameters()) {
    const auto found = s.where.find(item.key());
    DDP_INTERNAL_ASSERT(found != s.where.end(), "parameter ", item.key(), " is in no unit");
    expected.emplace_back(item.key(), s.units[found->second.first]->entries()[found->second.second].shape);
  }
  for (const auto& item : module_->named_buffers()) {
    expected.emplace_back(item.key(), item.value().sizes().vec());
  }
  check_state(s.config.who, state, expected);
  torch::NoGradGuard no_grad;
  for (auto& unit : s.units) {
    auto full = torch::zeros({unit->padded_numel()}, unit->shard().options().requires_grad(false));
    for (const auto& entry : unit->entries()) {
      full.narrow(0, entry.offset, entry.numel).copy_(state[entry.name].reshape({-1}));
    }
    unit->load_full(full);
  }
  for (auto& item : module_->named_buffers()) {
    item.value().copy_(state[item.key()]);
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
    device = unit->shard().device();
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
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& item : module.named_parameters()) {
    expected.emplace_back(item.key(), item.value().sizes().vec());
  }
  for (const auto& item : module.named_buffers()) {
    expected.emplace_back(item.key(), item.value().sizes().vec());
  }
  check_state("load_full_state_dict", state, expected);
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    item.value().copy_(state[item.key()]);
  }
  for (auto& item : module.named_buffers()) {
    item.value().copy_(state[item.key()]);
  }
}

StateDict full_state_dict_of(const torch::nn::Module& module) {
  StateDict state;
  torch::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    state.insert(item.key(), item.value().detach().clone());
  }
  for (const auto& item : module.named_buffers()) {
    state.insert(item.key(), item.value().detach().clone());
  }
  return state;
}

} // namespace ddp
