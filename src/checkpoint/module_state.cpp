// Module state dicts with PyTorch's names and order, and PyTorch's
// load_state_dict (state_dict.h).

#include <torch/nn/module.h>

#include <set>

#include <ddp/checkpoint/state_dict.h>
#include <ddp/nn/activation_checkpoint.h>
#include <ddp/nn/fully_sharded_data_parallel.h>

#include "checkpoint/names.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp {

namespace checkpoint {

namespace {

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void walk(const torch::nn::Module& module, const std::string& prefix, const std::string& raw_prefix,
          std::vector<NamedTensor>& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    out.push_back({joined(prefix, item.key()), joined(raw_prefix, item.key()), item.value(), true});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    out.push_back({joined(prefix, item.key()), joined(raw_prefix, item.key()), item.value(), false});
  }
  const bool unit = dynamic_cast<const FsdpUnitImpl*>(&module) != nullptr ||
                    dynamic_cast<const CheckpointedImpl*>(&module) != nullptr;
  for (const auto& child : module.named_children()) {
    // A FsdpUnit or a Checkpointed is transparent: its child "module" adds
    // no level, as PyTorch's wrappers add none to state dicts.
    const bool transparent = unit && child.key() == "module";
    walk(*child.value(), transparent ? prefix : joined(prefix, child.key()), joined(raw_prefix, child.key()), out);
  }
}

} // namespace

std::vector<NamedTensor> named_state(const torch::nn::Module& module) {
  std::vector<NamedTensor> out;
  walk(module, "", "", out);
  return out;
}

ResolvedState resolve_state(const torch::nn::Module& module, const StateDict& state, const std::string& who,
                            bool strict, const std::function<std::vector<int64_t>(const NamedTensor&)>& shape_of) {
  ResolvedState out;
  std::vector<std::string> problems;
  std::set<std::string> used;
  bool legacy = false;
  for (const auto& item : named_state(module)) {
    if (out.by_raw.contains(item.raw_name)) {
      continue;
    }
    const at::Tensor* value = state.find(item.name);
    const std::string* key = &item.name;
    if (value == nullptr && item.raw_name != item.name) {
      value = state.find(item.raw_name); // with a FsdpUnit's "module" level, as earlier ddp saved it
      key = &item.raw_name;
      legacy = legacy || value != nullptr;
    }
    if (value == nullptr) {
      out.keys.missing_keys.push_back(item.name);
      continue;
    }
    used.insert(*key);
    const auto shape = shape_of(item);
    if (value->sizes().vec() != shape) {
      problems.push_back(c10::str("size mismatch for ", item.name, ": the state's tensor has shape ", value->sizes(),
                                  ", the module's ", c10::IntArrayRef(shape)));
      continue;
    }
    out.by_raw.insert(item.raw_name, *value);
  }
  for (const auto& entry : state) {
    if (used.count(entry.key()) == 0) {
      out.keys.unexpected_keys.push_back(entry.key());
    }
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string text;
    for (size_t i = 0; i < names.size() && i < 20; ++i) {
      text += (i == 0 ? "" : ", ") + names[i];
    }
    return names.size() > 20 ? c10::str(text, " and ", names.size() - 20, " more") : text;
  };
  if (strict && !out.keys.missing_keys.empty()) {
    problems.push_back("missing keys: " + list(out.keys.missing_keys));
  }
  if (strict && !out.keys.unexpected_keys.empty()) {
    problems.push_back("unexpected keys: " + list(out.keys.unexpected_keys));
  }
  if (!problems.empty()) {
    std::string text;
    for (const auto& p : problems) {
      text += (text.empty() ? "" : "; ") + p;
    }
    DDP_CHECK(false, who, ": the state does not fit the module: ", text);
  }
  if (legacy) {
    internal::log_warning(who + ": the state names parameters with a FsdpUnit's 'module' level "
                                "('block.module.weight'), as ddp saved them before; they load, but save again "
                                "to get PyTorch's names ('block.weight')");
  }
  return out;
}

std::string clean_name(const torch::nn::Module& module, const std::string& raw) {
  for (const auto& item : named_state(module)) {
    if (item.raw_name == raw) {
      return item.name;
    }
  }
  return raw;
}

} // namespace checkpoint

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict state;
  for (const auto& item : checkpoint::named_state(module)) {
    if (!state.contains(item.name)) {
      state.insert(item.name, item.tensor.detach());
    }
  }
  return state;
}

std::vector<std::string> module_parameter_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& item : checkpoint::named_state(module)) {
    if (item.parameter && seen.insert(item.name).second) {
      names.push_back(item.name);
    }
  }
  return names;
}

IncompatibleKeys load_module_state_dict(torch::nn::Module& module, const StateDict& state,
                                        const LoadStateDictOptions& options) {
  auto resolved = checkpoint::resolve_state(module, state, "load_module_state_dict", options.strict(),
                                            [](const checkpoint::NamedTensor& item) { return item.tensor.sizes().vec(); });
  at::NoGradGuard no_grad;
  for (const auto& item : checkpoint::named_state(module)) {
    if (const at::Tensor* value = resolved.by_raw.find(item.raw_name)) {
      item.tensor.detach().copy_(*value);
    }
  }
  return resolved.keys;
}

} // namespace ddp
