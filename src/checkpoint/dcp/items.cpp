// DCP items of a plain module (a DDP job's) and its optimizer, plain or a
// ZeroRedundancyOptimizer (items.h), and what FSDP's share with them.

#include "checkpoint/dcp/items.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <ddp/optim/zero_redundancy_optimizer.h>

#include "checkpoint/names.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/torch_format_values.h"
#include "internal/check.h"

namespace ddp::checkpoint::dcp {

std::vector<PathStep> model_path(const std::string& name) {
  return {std::string("model"), name};
}

std::vector<PathStep> state_path(const std::string& name, const std::string& state) {
  return {std::string("optim"), std::string("state"), name, state};
}

std::string state_key(const std::string& name, const std::string& state) {
  return "optim.state." + name + "." + state;
}

TensorItem whole_item(std::string key, std::vector<PathStep> path, const at::Tensor& tensor) {
  TensorItem item;
  item.key = std::move(key);
  item.path = std::move(path);
  item.dtype = tensor.scalar_type();
  item.size = tensor.sizes().vec();
  item.box.offsets.assign(item.size.size(), 0);
  item.box.sizes = item.size;
  item.data = tensor.detach();
  return item;
}

namespace {

// Names of the optimizer's parameters, group by group, from `module`.
std::vector<std::vector<std::string>> group_names(const torch::nn::Module& module,
                                                  const torch::optim::Optimizer& optimizer, const std::string& who) {
  std::map<const void*, std::string> names;
  for (const auto& item : named_state(module)) {
    if (item.parameter) {
      names.emplace(item.tensor.unsafeGetTensorImpl(), item.name);
    }
  }
  std::vector<std::vector<std::string>> out;
  for (const auto& group : optimizer.param_groups()) {
    out.emplace_back();
    for (const auto& p : group.params()) {
      const auto found = names.find(p.unsafeGetTensorImpl());
      DDP_CHECK(found != names.end(), who, ": the optimizer holds a tensor of shape ", p.sizes(),
                " that is not a parameter of the model; DCP names optimizer state by parameter name");
      out.back().push_back(found->second);
    }
  }
  return out;
}

} // namespace

void add_group_items(SaveItems& items, const torch::optim::Optimizer& optimizer,
                     const std::vector<std::vector<std::string>>& group_names) {
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto group = static_cast<int64_t>(g);
    auto add = [&](const std::string& name, pickle::ValuePtr value) {
      items.bytes.push_back({c10::str("optim.param_groups.", g, ".", name),
                             {std::string("optim"), std::string("param_groups"), group, name}, std::move(value)});
    };
    for (const auto& [name, value] : export_options(groups[g].options())) {
      add(name, to_pickle(value));
    }
    std::vector<pickle::ValuePtr> params;
    for (const auto& name : group_names[g]) {
      params.push_back(pickle::string(name));
    }
    add("params", pickle::list(std::move(params)));
  }
}

SaveItems save_items(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer) {
  SaveItems items;
  std::set<std::string> seen;
  for (const auto& item : named_state(module)) {
    if (seen.insert(item.name).second) {
      items.tensors.push_back(whole_item("model." + item.name, model_path(item.name), item.tensor));
    }
  }
  if (optimizer == nullptr) {
    return items;
  }
  const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizerBase*>(optimizer);
  const torch::optim::Optimizer& holder =
      zero != nullptr ? const_cast<optim::ZeroRedundancyOptimizerBase*>(zero)->local_optimizer() : *optimizer;
  kind_of(holder);
  const auto names = group_names(module, *optimizer, "dcp::save");
  const auto& groups = optimizer->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto* state = param_state(holder, groups[g].params()[i]);
      if (state == nullptr) {
        continue; // no state yet, or (ZeRO) another rank's
      }
      const std::string& name = names[g][i];
      for (const auto& item : export_param_state(*state)) {
        items.tensors.push_back(whole_item(state_key(name, item.key()), state_path(name, item.key()), item.value()));
      }
    }
  }
  add_group_items(items, *optimizer, names);
  return items;
}

std::map<std::string, std::vector<std::string>> saved_states(const Metadata& metadata) {
  std::map<std::string, std::vector<std::string>> out;
  const std::string prefix = "optim.state.";
  for (const auto& [key, entry] : metadata.entries) {
    if (key.compare(0, prefix.size(), prefix) != 0) {
      continue;
    }
    const size_t dot = key.rfind('.');
    if (dot <= prefix.size()) {
      continue;
    }
    out[key.substr(prefix.size(), dot - prefix.size())].push_back(key.substr(dot + 1));
  }
  return out;
}

NewState new_state(const torch::optim::Optimizer& optimizer, size_t group, const at::Tensor& param,
                   const std::vector<std::string>& names, const std::string& who,
                   torch::optim::OptimizerParamState* present) {
  const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizerBase*>(&optimizer);
  const auto kind =
      kind_of(zero != nullptr ? const_cast<optim::ZeroRedundancyOptimizerBase*>(zero)->local_optimizer() : optimizer);
  const auto& options = optimizer.param_groups()[group].options();
  auto state_of = [&](const at::Tensor& like) {
    torch::OrderedDict<std::string, at::Tensor> zeros;
    for (const auto& name : names) {
      zeros.insert(name, name == "step" ? at::scalar_tensor(0.0, at::TensorOptions(at::kFloat))
                                        : at::zeros(like.sizes(), like.options().requires_grad(false)));
    }
    return import_param_state(kind, options, zeros, like, who);
  };
  // The names checked (unknown ones, those the options need) on a
  // one-element stand-in, before anything of the parameter's size exists.
  auto made = state_of(at::zeros({1}, at::TensorOptions(param.scalar_type())));
  NewState out;
  if (!made) {
    return out;
  }
  std::vector<std::string> wanted;
  for (const auto& item : export_param_state(*made)) {
    wanted.push_back(item.key());
  }
  if (present != nullptr) {
    std::vector<std::string> has;
    bool same = true;
    for (const auto& item : export_param_state(*present)) {
      has.push_back(item.key());
      same = same && (item.key() == "step" || (item.value().sizes() == param.sizes() &&
                                               item.value().scalar_type() == param.scalar_type()));
    }
    if (same && has == wanted) {
      out.reused = true;
      for (const auto& item : export_param_state(*present)) {
        if (item.key() != "step") {
          out.tensors.insert(item.key(), item.value()); // the present state's own tensors
        }
      }
      out.set_step = [present](int64_t step) { set_step(*present, step); };
      return out;
    }
  }
  out.state = state_of(param);
  for (const auto& item : export_param_state(*out.state)) {
    if (item.key() != "step") {
      out.tensors.insert(item.key(), item.value()); // aliases of the new state's tensors
    }
  }
  auto* state = out.state.get();
  out.set_step = [state](int64_t step) { set_step(*state, step); };
  return out;
}

void StagedOptimizer::prepare(const LoadItems& items, const std::string& who) {
  auto& param_groups = groups->param_groups();
  DDP_CHECK(items.group_options.size() == param_groups.size(), who, ": the checkpoint's optimizer has ",
            items.group_options.size(), " parameter groups, this one ", param_groups.size());
  for (size_t g = 0; g < param_groups.size(); ++g) {
    std::vector<std::pair<std::string, c10::IValue>> values;
    bool listed = false;
    for (const auto& [name, value] : items.group_options[g]) {
      if (name != "params") {
        values.emplace_back(name, value);
        continue;
      }
      listed = true;
      std::set<std::string> saved;
      if (value.isTuple()) {
        for (const auto& v : value.toTupleRef().elements()) {
          if (v.isString()) {
            saved.insert(v.toStringRef());
          }
        }
      }
      for (const auto& name : items.group_params[g]) {
        DDP_CHECK(saved.count(name) == 1, who, ": parameter ", name, " is in group ", g,
                  " of this optimizer and not in the checkpoint's group ", g);
      }
      DDP_CHECK(saved.size() == items.group_params[g].size(), who, ": group ", g, " of the checkpoint has ",
                saved.size(), " parameters, this optimizer's ", items.group_params[g].size());
    }
    DDP_CHECK(listed, who, ": the checkpoint has no optim.param_groups.", g, ".params");
    options.push_back(param_groups[g].options().clone());
    import_options(*options.back(), values, c10::str(who, ": group ", g));
  }
}

void StagedOptimizer::install() {
  auto& param_groups = groups->param_groups();
  for (size_t g = 0; g < options.size(); ++g) {
    param_groups[g].set_options(std::move(options[g]));
  }
  for (auto& [param, state] : states) {
    set_param_state(*holder, param, std::move(state));
  }
}

LoadItems load_items(const Metadata& metadata, torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  LoadItems items;
  std::set<std::string> seen;
  for (const auto& item : named_state(module)) {
    if (seen.insert(item.name).second) {
      items.tensors.push_back(whole_item("model." + item.name, model_path(item.name), item.tensor));
      items.model_keys.insert("model." + item.name);
    }
  }
  if (optimizer == nullptr) {
    items.commit = [] {};
    items.prepare = [](const LoadItems&) {};
    return items;
  }
  items.has_optimizer = true;
  auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizerBase*>(optimizer);
  auto staged = std::make_shared<StagedOptimizer>();
  staged->groups = optimizer;
  staged->holder = zero != nullptr ? &zero->local_optimizer() : optimizer;
  kind_of(*staged->holder);
  items.group_params = group_names(module, *optimizer, "the optimizer");
  const auto saved = saved_states(metadata);
  const auto& groups = optimizer->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      const std::string& name = items.group_params[g][i];
      items.optim_names.insert(name);
      if (zero != nullptr && zero->owner_of(p) != zero->process_group()->rank()) {
        continue; // another rank's state
      }
      const auto found = saved.find(name);
      if (found == saved.end()) {
        staged->states.emplace_back(p, nullptr); // no state in the checkpoint: none after
        continue;
      }
      auto made = new_state(*optimizer, g, p, found->second, c10::str("parameter ", name),
                            const_cast<torch::optim::OptimizerParamState*>(param_state(*staged->holder, p)));
      for (const auto& t : made.tensors) {
        items.tensors.push_back(whole_item(state_key(name, t.key()), state_path(name, t.key()), t.value()));
      }
      if (made.set_step && std::find(found->second.begin(), found->second.end(), "step") != found->second.end()) {
        items.steps.emplace_back(state_key(name, "step"), made.set_step);
      }
      if (!made.reused) {
        staged->states.emplace_back(p, std::move(made.state));
      }
    }
  }
  items.prepare = [staged](const LoadItems& all) { staged->prepare(all, "the optimizer"); };
  items.commit = [staged] { staged->install(); };
  return items;
}

} // namespace ddp::checkpoint::dcp
