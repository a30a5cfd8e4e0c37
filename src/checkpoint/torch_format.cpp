// State dicts in torch.save's format (torch_format.h): the conversions
// between ddp's state dicts and the pickled objects Python writes.

#include <ddp/comm/error.h>
#include <ddp/checkpoint/torch_format.h>

#include <c10/util/StringUtil.h>

#include "checkpoint/torch_format_values.h"
#include "checkpoint/torch_save.h"
#include "internal/check.h"

namespace ddp {

namespace checkpoint {

using pickle::Value;
using pickle::ValuePtr;

ValuePtr to_pickle(const c10::IValue& value) {
  if (value.isNone()) {
    return pickle::none();
  }
  if (value.isBool()) {
    return pickle::boolean(value.toBool());
  }
  if (value.isInt()) {
    return pickle::integer(value.toInt());
  }
  if (value.isDouble()) {
    return pickle::number(value.toDouble());
  }
  if (value.isString()) {
    return pickle::string(value.toStringRef());
  }
  if (value.isTensor()) {
    return pickle::tensor(value.toTensor());
  }
  if (value.isTuple() || value.isList()) {
    std::vector<ValuePtr> items;
    for (const auto& item : value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec()) {
      items.push_back(to_pickle(item));
    }
    return value.isTuple() ? pickle::tuple(std::move(items)) : pickle::list(std::move(items));
  }
  DDP_CHECK(false, "optimizer state dicts: an option of type ", value.tagKind(), " has no pickled form in ddp");
}

c10::IValue to_ivalue(const Value& value, const std::string& what) {
  switch (value.kind) {
    case Value::Kind::kNone:
      return {};
    case Value::Kind::kBool:
      return value.boolean;
    case Value::Kind::kInt:
      return value.integer;
    case Value::Kind::kFloat:
      return value.number;
    case Value::Kind::kString:
      return value.text;
    case Value::Kind::kTensor:
      return value.tensor;
    case Value::Kind::kTuple:
    case Value::Kind::kList: {
      std::vector<c10::IValue> items;
      for (const auto& item : value.items) {
        items.push_back(to_ivalue(*item, what));
      }
      return c10::ivalue::Tuple::create(std::move(items));
    }
    default:
      throw std::runtime_error(what + " holds " + value.describe() + " where ddp expects a number, a string or a tuple");
  }
}

ValuePtr state_dict_value(const StateDict& state) {
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  for (const auto& item : state) {
    entries.emplace_back(pickle::string(item.key()), pickle::tensor(item.value()));
  }
  return pickle::dict(std::move(entries), /*ordered=*/true);
}

StateDict state_dict_of(const Value& value, const std::string& what) {
  if (!value.is(Value::Kind::kDict)) {
    throw std::runtime_error(what + " holds " + value.describe() + ", expected a state dict (a dict of tensors)");
  }
  StateDict state;
  for (const auto& [k, v] : value.entries) {
    if (!k->is(Value::Kind::kString)) {
      throw std::runtime_error(what + ": a key is " + k->describe() + ", expected a parameter's name");
    }
    if (!v->is(Value::Kind::kTensor)) {
      throw std::runtime_error(what + ": '" + k->text + "' is " + v->describe() +
                               ", expected a tensor (is this a state dict? a checkpoint of several dicts "
                               "is read with a key)");
    }
    if (state.contains(k->text)) {
      throw std::runtime_error(what + ": '" + k->text + "' appears twice");
    }
    state.insert(k->text, v->tensor);
  }
  return state;
}

ValuePtr optimizer_value(const OptimizerStateDict& state, bool by_name) {
  auto key_of = [&](int64_t index) -> ValuePtr {
    if (by_name) {
      DDP_CHECK(index >= 0 && static_cast<size_t>(index) < state.param_names.size(),
                "optimizer state dicts: parameter ", index, " has no name");
      return pickle::string(state.param_names[static_cast<size_t>(index)]);
    }
    return pickle::integer(index);
  };
  std::vector<std::pair<ValuePtr, ValuePtr>> states;
  for (const auto& [index, tensors] : state.state) {
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (const auto& item : tensors) {
      entries.emplace_back(pickle::string(item.key()), pickle::tensor(item.value()));
    }
    states.emplace_back(key_of(index), pickle::dict(std::move(entries)));
  }
  std::vector<ValuePtr> groups;
  for (const auto& group : state.param_groups) {
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (const auto& [name, option] : group.options) {
      entries.emplace_back(pickle::string(name), to_pickle(option));
    }
    std::vector<ValuePtr> params;
    for (int64_t index : group.params) {
      params.push_back(key_of(index));
    }
    entries.emplace_back(pickle::string("params"), pickle::list(std::move(params)));
    groups.push_back(pickle::dict(std::move(entries)));
  }
  return pickle::dict({{pickle::string("state"), pickle::dict(std::move(states))},
                       {pickle::string("param_groups"), pickle::list(std::move(groups))}});
}

OptimizerStateDict optimizer_state_of(const Value& value, const std::string& what) {
  const Value* state = value.get("state");
  const Value* groups = value.get("param_groups");
  if (state == nullptr || groups == nullptr || !state->is(Value::Kind::kDict) || !groups->is(Value::Kind::kList)) {
    throw std::runtime_error(what + " holds " + value.describe() +
                             ", expected an optimizer's state dict ({'state': {...}, 'param_groups': [...]})");
  }
  OptimizerStateDict out;
  // Parameters are numbered by their place in the groups; keys may be ints
  // (optimizer.state_dict()) or names (FSDP's optim_state_dict).
  std::vector<std::pair<const Value*, int64_t>> ids; // the file's key, our index
  auto index_of = [&](const Value& key) -> int64_t {
    for (const auto& [k, i] : ids) {
      if (k->kind == key.kind && k->integer == key.integer && k->text == key.text) {
        return i;
      }
    }
    return -1;
  };
  bool named = false;
  for (const auto& g : groups->items) {
    const Value* params = g->get("params");
    if (!g->is(Value::Kind::kDict) || params == nullptr || !params->is(Value::Kind::kList)) {
      throw std::runtime_error(what + ": a parameter group is not a dict with a 'params' list");
    }
    OptimizerStateDict::ParamGroup group;
    for (const auto& [k, v] : g->entries) {
      if (!k->is(Value::Kind::kString)) {
        throw std::runtime_error(what + ": a parameter group has a key that is " + k->describe());
      }
      if (k->text != "params") {
        group.options.emplace_back(k->text, to_ivalue(*v, what + " option '" + k->text + "'"));
      }
    }
    for (const auto& p : params->items) {
      if (!p->is(Value::Kind::kInt) && !p->is(Value::Kind::kString)) {
        throw std::runtime_error(what + ": a parameter group lists " + p->describe() + ", expected an index or a name");
      }
      if (index_of(*p) >= 0) {
        throw std::runtime_error(what + ": parameter " + p->describe() + " is in two groups");
      }
      named = named || p->is(Value::Kind::kString);
      const auto index = static_cast<int64_t>(ids.size());
      ids.emplace_back(p.get(), index);
      out.param_names.push_back(p->is(Value::Kind::kString) ? p->text : std::string());
      group.params.push_back(index);
    }
    out.param_groups.push_back(std::move(group));
  }
  if (!named) {
    out.param_names.clear();
  }
  for (const auto& [k, v] : state->entries) {
    const int64_t index = index_of(*k);
    if (index < 0) {
      throw std::runtime_error(what + ": the state of parameter " + k->describe() + ", which no group lists");
    }
    if (!v->is(Value::Kind::kDict)) {
      throw std::runtime_error(what + ": the state of parameter " + k->describe() + " is " + v->describe());
    }
    torch::OrderedDict<std::string, at::Tensor> tensors;
    for (const auto& [name, t] : v->entries) {
      if (!name->is(Value::Kind::kString)) {
        throw std::runtime_error(what + ": a state key of parameter " + k->describe() + " is " + name->describe());
      }
      if (t->is(Value::Kind::kNone)) {
        continue; // PyTorch 1.13's SGD: momentum_buffer None
      }
      if (t->is(Value::Kind::kInt) || t->is(Value::Kind::kFloat)) { // a step kept as a number
        tensors.insert(name->text, at::scalar_tensor(t->is(Value::Kind::kInt) ? static_cast<double>(t->integer) : t->number,
                                                     at::TensorOptions(at::kFloat)));
        continue;
      }
      if (!t->is(Value::Kind::kTensor)) {
        throw std::runtime_error(what + ": state '" + name->text + "' of parameter " + k->describe() + " is " +
                                 t->describe());
      }
      tensors.insert(name->text, t->tensor);
    }
    out.state.emplace(index, std::move(tensors));
  }
  return out;
}

const Value& select(const Value& root, const std::string& key, const std::string& what) {
  if (key.empty()) {
    return root;
  }
  const Value* found = root.get(key);
  if (found == nullptr) {
    std::string keys;
    for (const auto& [k, v] : root.entries) {
      keys += (keys.empty() ? "" : ", ") + (k->is(Value::Kind::kString) ? "'" + k->text + "'" : k->describe());
    }
    throw std::runtime_error(what + " has no key '" + key + "'" +
                             (root.is(Value::Kind::kDict) ? " (its keys: " + keys + ")" : " (it holds " + root.describe() + ")"));
  }
  return *found;
}

} // namespace checkpoint

namespace {

// Runs `body`, turning the std::runtime_errors of the file layers into
// c10::Error as the rest of ddp throws.
template <typename Body>
auto with_c10_errors(const char* op, Body body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    DDP_CHECK(false, op, ": ", error_message(e));
  }
}

} // namespace

void save_torch_state_dict(const StateDict& state, const std::string& path) {
  with_c10_errors("save_torch_state_dict", [&] { checkpoint::save_torch_file(*checkpoint::state_dict_value(state), path); });
}

StateDict load_torch_state_dict(const std::string& path, const std::string& key) {
  return with_c10_errors("load_torch_state_dict", [&] {
    const auto root = checkpoint::load_torch_file(path);
    const std::string what = "'" + path + "'" + (key.empty() ? "" : "['" + key + "']");
    return checkpoint::state_dict_of(checkpoint::select(*root, key, "'" + path + "'"), what);
  });
}

void save_torch_optimizer_state_dict(const OptimizerStateDict& state, const std::string& path) {
  with_c10_errors("save_torch_optimizer_state_dict", [&] {
    checkpoint::save_torch_file(*checkpoint::optimizer_value(state, /*by_name=*/false), path);
  });
}

OptimizerStateDict load_torch_optimizer_state_dict(const std::string& path, const std::string& key) {
  return with_c10_errors("load_torch_optimizer_state_dict", [&] {
    const auto root = checkpoint::load_torch_file(path);
    const std::string what = "'" + path + "'" + (key.empty() ? "" : "['" + key + "']");
    return checkpoint::optimizer_state_of(checkpoint::select(*root, key, "'" + path + "'"), what);
  });
}

} // namespace ddp
