// FullyShardedDataParallel's optimizer state as a full optimizer state dict
// of the unwrapped model, and back (PyTorch's FSDP.optim_state_dict with
// FULL_STATE_DICT, and optim_state_dict_to_load).
//
// How it works. The optimizer steps the flat shards: each shard's state
// (Adam's exp_avg, exp_avg_sq) is shaped as the shard, one step per shard.
// Saving gathers each state tensor of each unit from every rank's shard
// (gather_flat, in unit order, a collective) and cuts the padded flat
// result at the parameters' offsets, so that parameter p's exp_avg is what
// a plain optimizer over the unwrapped model would hold; "step" is the
// shard's, the same for every parameter of the unit. Loading does the
// reverse, locally: each rank assembles the flat state of its shard from
// the parameters' full tensors. Parameters are numbered as a plain
// optimizer over the unwrapped model numbers them: group by group, in the
// module's parameter order (module_state_dict's).

#include <torch/torch.h>

#include <map>

#include <ddp/checkpoint/state_dict.h>
#include <ddp/nn/fully_sharded_data_parallel.h>

#include "checkpoint/names.h"
#include "checkpoint/optimizer_state.h"
#include "fsdp/fsdp_state.h"
#include "internal/check.h"

namespace ddp {

namespace {

using Tensors = torch::OrderedDict<std::string, at::Tensor>;

using detail::ParamSlot;

} // namespace

namespace detail {

std::vector<std::vector<ParamSlot>> optimizer_param_slots(FullyShardedDataParallelImpl& model,
                                                          const torch::optim::Optimizer& optimizer,
                                                          const std::string& who) {
  auto& s = detail::FsdpAccess::state(model);
  std::map<std::string, std::pair<std::string, size_t>> clean; // raw -> (name, order)
  size_t order = 0;
  for (const auto& item : checkpoint::named_state(detail::FsdpAccess::module(model))) {
    if (item.parameter) {
      clean.emplace(item.raw_name, std::make_pair(item.name, order++));
    }
  }
  std::map<const void*, size_t> unit_of_shard;
  for (size_t u = 0; u < s.units.size(); ++u) {
    unit_of_shard[s.units[u]->shard().unsafeGetTensorImpl()] = u;
  }
  std::vector<std::vector<ParamSlot>> groups;
  std::vector<int> seen(s.units.size(), 0);
  for (const auto& group : optimizer.param_groups()) {
    std::vector<ParamSlot> slots;
    for (const auto& p : group.params()) {
      const auto found = unit_of_shard.find(p.unsafeGetTensorImpl());
      DDP_CHECK(found != unit_of_shard.end(), who,
                ": the optimizer holds a tensor that is not one of this model's shards; build it over "
                "model->parameters()");
      ++seen[found->second];
      const auto& entries = s.units[found->second]->entries();
      for (size_t e = 0; e < entries.size(); ++e) {
        const auto c = clean.find(entries[e].name);
        DDP_INTERNAL_ASSERT(c != clean.end(), "parameter ", entries[e].name, " has no name");
        slots.push_back({found->second, e, c->second.first, c->second.second});
      }
    }
    std::sort(slots.begin(), slots.end(), [](const ParamSlot& a, const ParamSlot& b) { return a.order < b.order; });
    groups.push_back(std::move(slots));
  }
  for (size_t u = 0; u < seen.size(); ++u) {
    DDP_CHECK(seen[u] == 1, who, ": unit ", u, "'s shard (flat_param_", u, ") is in ", seen[u],
              " of the optimizer's parameter groups, expected 1");
  }
  return groups;
}

} // namespace detail

namespace {
using detail::optimizer_param_slots;
} // namespace

OptimizerStateDict full_optimizer_state_dict(FullyShardedDataParallel& model, const torch::optim::Optimizer& optimizer,
                                             const FullStateDictOptions& options) {
  auto& s = detail::FsdpAccess::state(*model);
  const std::string who = s.config.who + " full_optimizer_state_dict";
  checkpoint::kind_of(optimizer);
  const auto groups = optimizer_param_slots(*model, optimizer, who);
  const bool keep = !options.rank0_only() || s.group->rank() == 0;

  // Per unit: each state tensor joined from every rank's shard (collectives,
  // every rank in unit order, names in the state's order).
  std::vector<Tensors> full(s.units.size());
  for (size_t u = 0; u < s.units.size(); ++u) {
    const auto* state = checkpoint::param_state(optimizer, s.units[u]->shard());
    if (state == nullptr) {
      continue;
    }
    for (const auto& item : checkpoint::export_param_state(*state)) {
      full[u].insert(item.key(), item.key() == "step" ? item.value() : s.units[u]->gather_flat(item.value()));
    }
  }
  OptimizerStateDict out;
  if (!keep) {
    return out;
  }
  torch::NoGradGuard no_grad;
  auto place = [&](const at::Tensor& t) { return options.offload_to_cpu() ? t.to(at::kCPU) : t; };
  int64_t index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    OptimizerStateDict::ParamGroup group;
    group.options = checkpoint::export_options(optimizer.param_groups()[g].options());
    for (const auto& slot : groups[g]) {
      if (!full[slot.unit].is_empty()) {
        const auto& entry = s.units[slot.unit]->entries()[slot.entry];
        Tensors state;
        for (const auto& item : full[slot.unit]) {
          state.insert(item.key(), item.key() == "step"
                                       ? item.value().clone()
                                       : place(item.value().narrow(0, entry.offset, entry.numel).view(entry.shape).clone()));
        }
        out.state.emplace(index, std::move(state));
      }
      out.param_names.push_back(slot.name);
      group.params.push_back(index++);
    }
    out.param_groups.push_back(std::move(group));
  }
  return out;
}

void load_full_optimizer_state_dict(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                                    const OptimizerStateDict& state) {
  auto& s = detail::FsdpAccess::state(*model);
  const std::string who = s.config.who + " load_full_optimizer_state_dict";
  const auto kind = checkpoint::kind_of(optimizer);
  const auto groups = optimizer_param_slots(*model, optimizer, who);
  auto& opt_groups = optimizer.param_groups();
  DDP_CHECK(groups.size() == state.param_groups.size(), who, ": the state has ", state.param_groups.size(),
            " parameter groups, the optimizer ", groups.size());
  // The state's tensors of each (unit, entry), by position in the groups.
  std::vector<std::vector<const Tensors*>> of_entry(s.units.size());
  for (size_t u = 0; u < s.units.size(); ++u) {
    of_entry[u].assign(s.units[u]->entries().size(), nullptr);
  }
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<size_t> group_of_unit(s.units.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& slot : groups[g]) {
      group_of_unit[slot.unit] = g;
    }
    DDP_CHECK(groups[g].size() == state.param_groups[g].params.size(), who, ": parameter group ", g,
              " of the state has ", state.param_groups[g].params.size(), " parameters, the unwrapped model's has ",
              groups[g].size());
    options.push_back(opt_groups[g].options().clone());
    checkpoint::import_options(*options.back(), state.param_groups[g].options, c10::str(who, ": group ", g));
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const auto found = state.state.find(state.param_groups[g].params[i]);
      if (found != state.state.end()) {
        of_entry[groups[g][i].unit][groups[g][i].entry] = &found->second;
      }
    }
  }
  // Each shard's state, assembled from its parameters' (zeros for a
  // parameter without state in a unit whose others have one).
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> states(s.units.size());
  for (size_t u = 0; u < s.units.size(); ++u) {
    auto& unit = *s.units[u];
    const auto& entries = unit.entries();
    const Tensors* first = nullptr;
    for (const auto* t : of_entry[u]) {
      first = first != nullptr ? first : t;
    }
    if (first == nullptr) {
      continue;
    }
    Tensors flat;
    const int64_t begin = unit.shard_rank() * unit.shard_numel();
    for (const auto& item : *first) {
      if (item.key() == "step") {
        for (size_t e = 0; e < entries.size(); ++e) {
          const at::Tensor* step = of_entry[u][e] != nullptr ? of_entry[u][e]->find("step") : nullptr;
          DDP_CHECK(step == nullptr || at::equal(step->to(at::kFloat).reshape({}), item.value().to(at::kFloat).reshape({})),
                    who, ": parameters ", entries[0].name, " and ", entries[e].name,
                    " of unit ", u, " have different steps; ddp keeps one step per unit");
        }
        flat.insert("step", item.value());
        continue;
      }
      auto full = at::zeros({unit.padded_numel()}, unit.shard().options().requires_grad(false));
      for (size_t e = 0; e < entries.size(); ++e) {
        const at::Tensor* v = of_entry[u][e] != nullptr ? of_entry[u][e]->find(item.key()) : nullptr;
        if (v == nullptr) {
          continue;
        }
        DDP_CHECK(v->numel() == entries[e].numel, who, ": '", item.key(), "' of parameter ", entries[e].name,
                  " has shape ", v->sizes(), ", the parameter's is ", c10::IntArrayRef(entries[e].shape));
        full.narrow(0, entries[e].offset, entries[e].numel).copy_(v->reshape({-1}));
      }
      flat.insert(item.key(), full.narrow(0, begin, unit.shard_numel()));
    }
    states[u] = checkpoint::import_param_state(kind, *options.at(group_of_unit[u]), flat, unit.shard(),
                                               c10::str(who, ": unit ", u, " (", entries.front().name, ", ...)"));
  }
  for (size_t g = 0; g < opt_groups.size(); ++g) {
    opt_groups[g].set_options(std::move(options[g]));
  }
  for (size_t u = 0; u < s.units.size(); ++u) {
    checkpoint::set_param_state(optimizer, s.units[u]->shard(), std::move(states[u]));
  }
}

} // namespace ddp
