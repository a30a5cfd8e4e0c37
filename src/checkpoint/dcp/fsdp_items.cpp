// DCP items of a FullyShardedDataParallel model and its optimizer (items.h):
// every rank saves and loads the parts of each parameter that its shard
// holds, as boxes (boxes.h), and the same parts of the optimizer's states.

#include <torch/torch.h>

#include <ddp/nn/fully_sharded_data_parallel.h>

#include "checkpoint/dcp/boxes.h"
#include "checkpoint/dcp/items.h"
#include "checkpoint/names.h"
#include "checkpoint/optimizer_state.h"
#include "fsdp/fsdp_state.h"
#include "internal/check.h"

namespace ddp::checkpoint::dcp {

namespace {

// The pieces of entry `e` of `unit` that this rank's shard holds, as items
// of key `key` over `flat` (the shard, or a tensor shaped as it).
void add_pieces(std::vector<TensorItem>& out, const fsdp::FlatUnit& unit, const fsdp::FlatEntry& entry,
                const at::Tensor& flat, const std::string& key, const std::vector<PathStep>& path) {
  const int64_t begin = unit.shard_rank() * unit.shard_numel();
  const int64_t lo = std::max(entry.offset, begin);
  const int64_t hi = std::min(entry.offset + entry.numel, begin + unit.shard_numel());
  for (const auto& piece : boxes_of_range(entry.shape, lo - entry.offset, hi - entry.offset)) {
    TensorItem item;
    item.key = key;
    item.path = path;
    item.dtype = flat.scalar_type();
    item.size = entry.shape;
    item.box = piece.box;
    item.data = flat.detach().narrow(0, entry.offset + piece.flat_begin - begin, piece.box.numel()).view(piece.box.sizes);
    out.push_back(std::move(item));
  }
}

// The model's items: buffers whole, parameters in pieces.
void add_model(std::vector<TensorItem>& out, std::set<std::string>* keys, FullyShardedDataParallelImpl& model) {
  auto& s = detail::FsdpAccess::state(model);
  std::set<std::string> seen;
  for (const auto& item : named_state(detail::FsdpAccess::module(model))) {
    if (!seen.insert(item.name).second) {
      continue;
    }
    const std::string key = "model." + item.name;
    if (keys != nullptr) {
      keys->insert(key);
    }
    if (!item.parameter) {
      out.push_back(whole_item(key, model_path(item.name), item.tensor));
      continue;
    }
    const auto found = s.where.find(item.raw_name);
    DDP_INTERNAL_ASSERT(found != s.where.end(), "parameter ", item.raw_name, " is in no unit");
    auto& unit = *s.units[found->second.first];
    add_pieces(out, unit, unit.entries()[found->second.second], unit.shard(), key, model_path(item.name));
  }
}

} // namespace

SaveItems save_items(FullyShardedDataParallel& model, const torch::optim::Optimizer* optimizer) {
  SaveItems items;
  add_model(items.tensors, nullptr, *model);
  if (optimizer == nullptr) {
    return items;
  }
  auto& s = detail::FsdpAccess::state(*model);
  kind_of(*optimizer);
  const auto groups = detail::optimizer_param_slots(*model, *optimizer, "dcp::save");
  std::vector<std::vector<std::string>> names;
  for (const auto& group : groups) {
    names.emplace_back();
    for (const auto& slot : group) {
      names.back().push_back(slot.name);
    }
  }
  // Per unit its entries' names, in unit order.
  std::vector<std::vector<const detail::ParamSlot*>> of_unit(s.units.size());
  for (const auto& group : groups) {
    for (const auto& slot : group) {
      of_unit[slot.unit].push_back(&slot);
    }
  }
  for (size_t u = 0; u < s.units.size(); ++u) {
    const auto* state = param_state(*optimizer, s.units[u]->shard());
    if (state == nullptr) {
      continue;
    }
    const auto& unit = *s.units[u];
    for (const auto& item : export_param_state(*state)) {
      for (const auto* slot : of_unit[u]) {
        const std::string key = state_key(slot->name, item.key());
        const auto path = state_path(slot->name, item.key());
        if (item.key() == "step") {
          items.tensors.push_back(whole_item(key, path, item.value())); // the same on every rank: written once
        } else {
          add_pieces(items.tensors, unit, unit.entries()[slot->entry], item.value(), key, path);
        }
      }
    }
  }
  add_group_items(items, *optimizer, names);
  return items;
}

LoadItems load_items(const Metadata& metadata, FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer) {
  LoadItems items;
  add_model(items.tensors, &items.model_keys, *model);
  if (optimizer == nullptr) {
    items.commit = [] {};
    items.prepare = [](const LoadItems&) {};
    return items;
  }
  items.has_optimizer = true;
  auto& s = detail::FsdpAccess::state(*model);
  kind_of(*optimizer);
  const auto groups = detail::optimizer_param_slots(*model, *optimizer, "the optimizer");
  auto staged = std::make_shared<StagedOptimizer>();
  staged->groups = optimizer;
  staged->holder = optimizer;
  std::vector<std::vector<const detail::ParamSlot*>> of_unit(s.units.size());
  std::vector<size_t> group_of_unit(s.units.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    items.group_params.emplace_back();
    for (const auto& slot : groups[g]) {
      of_unit[slot.unit].push_back(&slot);
      group_of_unit[slot.unit] = g;
      items.group_params.back().push_back(slot.name);
      items.optim_names.insert(slot.name);
    }
  }
  const auto saved = saved_states(metadata);
  for (size_t u = 0; u < s.units.size(); ++u) {
    auto& unit = *s.units[u];
    // The unit's state holds every state name any of its parameters has.
    std::vector<std::string> names;
    for (const auto* slot : of_unit[u]) {
      const auto found = saved.find(slot->name);
      if (found == saved.end()) {
        continue;
      }
      for (const auto& n : found->second) {
        if (std::find(names.begin(), names.end(), n) == names.end()) {
          names.push_back(n);
        }
      }
    }
    if (names.empty()) {
      staged->states.emplace_back(unit.shard(), nullptr);
      continue;
    }
    // The present state is read into in place only when the checkpoint
    // covers all of it (a parameter it lacks gets zeros in a new state).
    bool every = true;
    for (const auto* slot : of_unit[u]) {
      every = every && saved.count(slot->name) == 1;
    }
    auto* present = every ? const_cast<torch::optim::OptimizerParamState*>(param_state(*optimizer, unit.shard()))
                          : nullptr;
    auto made = new_state(*optimizer, group_of_unit[u], unit.shard(), names,
                          c10::str("FSDP unit ", u, " (", of_unit[u].front()->name, ", ...)"), present);
    bool step_read = false;
    for (const auto* slot : of_unit[u]) {
      const auto found = saved.find(slot->name);
      if (found == saved.end()) {
        continue; // its part of the state stays zero
      }
      for (const auto& n : found->second) {
        if (n == "step") {
          if (!step_read && made.set_step) {
            items.steps.emplace_back(state_key(slot->name, "step"), made.set_step);
            step_read = true;
          }
          continue;
        }
        const at::Tensor* flat = made.tensors.find(n);
        if (flat != nullptr) {
          add_pieces(items.tensors, unit, unit.entries()[slot->entry], *flat, state_key(slot->name, n),
                     state_path(slot->name, n));
        }
      }
    }
    if (!made.reused) {
      staged->states.emplace_back(unit.shard(), std::move(made.state));
    }
  }
  items.prepare = [staged](const LoadItems& all) { staged->prepare(all, "the optimizer"); };
  items.commit = [staged] { staged->install(); };
  return items;
}

} // namespace ddp::checkpoint::dcp
