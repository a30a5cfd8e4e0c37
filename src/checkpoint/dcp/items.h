#pragma once

// What one rank saves into a DCP directory and what it loads from one
// (private header): the flattened state dict of a model and its optimizer,
// as PyTorch's get_state_dict() names it.
//
//   model.<name>                   a parameter or buffer (module_state_dict's names)
//   optim.state.<name>.<state>     a parameter's optimizer state ("exp_avg", "step")
//   optim.param_groups.<g>.<opt>   group g's option ("lr", "betas"), and "params",
//                                  the list of its parameters' names
//
// A rank holds a tensor whole (DDP: every rank the same, written once) or
// in pieces (FSDP's shards, ZeRO's owned states): each piece is a box with
// a view of this rank's memory, what is saved from and loaded into. See
// items.cpp (plain modules, DDP, ZeroRedundancyOptimizer) and
// fsdp_items.cpp (FullyShardedDataParallel).

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ddp/checkpoint/state_dict.h>

#include "checkpoint/dcp/metadata.h"
#include "checkpoint/pickle.h"

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
} // namespace torch::optim

namespace ddp {
class FullyShardedDataParallel;
} // namespace ddp

namespace ddp::checkpoint::dcp {

struct TensorItem {
  std::string key;
  std::vector<PathStep> path;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size; // the whole tensor's
  Box box;                   // the piece this rank holds
  at::Tensor data;           // shaped as box.sizes
};

struct BytesItem {
  std::string key;
  std::vector<PathStep> path;
  pickle::ValuePtr value;
};

struct SaveItems {
  std::vector<TensorItem> tensors;
  std::vector<BytesItem> bytes;
};

// The model of a DDP job (or a plain module) with its optimizer (plain, or
// a ZeroRedundancyOptimizer: only the states this rank owns).
SaveItems save_items(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer);
SaveItems save_items(FullyShardedDataParallel& model, const torch::optim::Optimizer* optimizer);

// What a load needs: the destinations of this rank, built against the
// checkpoint's metadata (an optimizer's states are made for the parameters
// the checkpoint has states of), and what to do once every tensor is read.
struct LoadItems {
  std::vector<TensorItem> tensors;
  // 0-dimensional "step" tensors: read, then handed to the setter.
  std::vector<std::pair<std::string, std::function<void(int64_t)>>> steps;
  // Keys expected, by kind, for the strict checks.
  std::set<std::string> model_keys;
  std::set<std::string> optim_names; // parameter names with optimizer state here
  bool has_optimizer = false;
  // Per parameter group: the expected parameter names, and where the options
  // read from optim.param_groups.<g>.* go.
  std::vector<std::vector<std::string>> group_params;
  std::vector<std::vector<std::pair<std::string, c10::IValue>>> group_options;
  // Checks group_options (filled by the loader) and stages them; runs
  // before any tensor is read.
  std::function<void(const LoadItems&)> prepare;
  // Installs what was staged (the optimizer's new states and options); runs
  // after every read succeeded.
  std::function<void()> commit;
  IncompatibleKeys keys;
};

LoadItems load_items(const Metadata& metadata, torch::nn::Module& module, torch::optim::Optimizer* optimizer);
LoadItems load_items(const Metadata& metadata, FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer);

// ---- Shared by the two files ----

// `tensor` whole, as one item of key `key`.
TensorItem whole_item(std::string key, std::vector<PathStep> path, const at::Tensor& tensor);

std::vector<PathStep> model_path(const std::string& name);
std::vector<PathStep> state_path(const std::string& name, const std::string& state);
std::string state_key(const std::string& name, const std::string& state);

// The optimizer's parameter groups as bytes items: options and "params".
void add_group_items(SaveItems& items, const torch::optim::Optimizer& optimizer,
                     const std::vector<std::vector<std::string>>& group_names);

// The checkpoint's optimizer states: parameter name -> its state names.
std::map<std::string, std::vector<std::string>> saved_states(const Metadata& metadata);

// An optimizer's new states and options, made while a load is checked and
// installed once every tensor is read. `holder` keeps the states (a
// ZeroRedundancyOptimizer's local optimizer), `groups` the options.
struct StagedOptimizer {
  torch::optim::Optimizer* groups = nullptr;
  torch::optim::Optimizer* holder = nullptr;
  // Every parameter whose state the load sets; nullptr erases it. Where
  // the parameter's present state was read into in place (NewState's
  // `reused`), nothing: it stays.
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  // Checks `items.group_options` (the checkpoint's, "params" included)
  // against the optimizer's groups and `items.group_params`, and stages the
  // options. Throws c10::Error starting with `who`.
  void prepare(const LoadItems& items, const std::string& who);
  void install();
};

// The state `param` gets from a load: its tensors, as PyTorch names them,
// are those the checkpoint has under `names`, to be read into, and a setter
// of its step. When `present` (the parameter's state now) holds the same
// tensors, they are read into in place (`reused`; no second copy of the
// optimizer's state in memory, the load's promise); else a new state of
// zeros, installed once every read succeeded.
struct NewState {
  std::unique_ptr<torch::optim::OptimizerParamState> state; // null when reused
  bool reused = false;
  torch::OrderedDict<std::string, at::Tensor> tensors;
  std::function<void(int64_t)> set_step;
};
NewState new_state(const torch::optim::Optimizer& optimizer, size_t group, const at::Tensor& param,
                   const std::vector<std::string>& names, const std::string& who,
                   torch::optim::OptimizerParamState* present);

} // namespace ddp::checkpoint::dcp
