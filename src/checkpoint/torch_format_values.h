#pragma once

// ddp's state dicts as the pickled objects Python's torch.save writes, and
// back (private header; torch_format.cpp). The readers throw
// std::runtime_error starting with `what` (the file, and the key within).

#include <ATen/core/ivalue.h>

#include <string>

#include <ddp/checkpoint/state_dict.h>

#include "checkpoint/pickle.h"

namespace ddp::checkpoint {

// An option's value (None, bool, int, float, str, tensor, tuple, list).
pickle::ValuePtr to_pickle(const c10::IValue& value);
c10::IValue to_ivalue(const pickle::Value& value, const std::string& what);

// collections.OrderedDict of name -> tensor.
pickle::ValuePtr state_dict_value(const StateDict& state);
StateDict state_dict_of(const pickle::Value& value, const std::string& what);

// {'state': {...}, 'param_groups': [...]}, parameters keyed by index, or
// by name (`by_name`, from param_names).
pickle::ValuePtr optimizer_value(const OptimizerStateDict& state, bool by_name);
OptimizerStateDict optimizer_state_of(const pickle::Value& value, const std::string& what);

// root[key] of a dict, or root when `key` is empty.
const pickle::Value& select(const pickle::Value& root, const std::string& key, const std::string& what);

} // namespace ddp::checkpoint
