#pragma once

/// State dicts as PyTorch has them: a module's parameters and buffers by
/// qualified name (Python's `model.state_dict()`), and an optimizer's state
/// in PyTorch's layout (Python's `optimizer.state_dict()`). They are what
/// the files of torch_format.h, safetensors.h and dcp.h hold, so that a
/// model moves between C++ and Python. See docs/ddp.md, "Moving checkpoints
/// between C++ and Python".

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
} // namespace torch::nn
namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace ddp {

/// Parameters and buffers by qualified name ("layers.0.weight").
using StateDict = torch::OrderedDict<std::string, at::Tensor>;

/// PyTorch's `model.state_dict()`: every parameter and buffer of `module`
/// by qualified name, module by module (a module's own parameters, then its
/// buffers, then its children's), the same names and order as Python's for
/// the same architecture. The tensors are detached aliases, not copies.
/// A ddp::FsdpUnit's own level ("module") is left out of the names, as
/// PyTorch leaves out its wrappers' (`_fsdp_wrapped_module`).
StateDict module_state_dict(const torch::nn::Module& module);

/// The names module_state_dict gives `module`'s parameters (its buffers
/// left out), in its order: Python's `[n for n, _ in model.named_parameters()]`
/// for the same architecture.
std::vector<std::string> module_parameter_names(const torch::nn::Module& module);

/// Options of load_module_state_dict.
struct LoadStateDictOptions {
  /// Refuse a state with keys the module lacks or without keys it has
  /// (PyTorch's `strict`). Default: true.
  TORCH_ARG(bool, strict) = true;
};

/// What load_module_state_dict did not match (PyTorch's _IncompatibleKeys).
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

/// PyTorch's `model.load_state_dict(state, strict)`: copies each value into
/// the parameter or buffer of its name (keeping their identity, device and
/// dtype; values are converted as copy_ converts). Checks everything before
/// changing anything: a shape that differs always throws, naming the key
/// and both shapes; under `strict`, so does a missing or unexpected key,
/// naming them all. Accepts the names of earlier ddp versions, which kept
/// a FsdpUnit's "module" level (with a warning).
IncompatibleKeys load_module_state_dict(torch::nn::Module& module, const StateDict& state,
                                        const LoadStateDictOptions& options = {});

/// An optimizer's state in PyTorch's layout:
/// `{'state': {index: {'step': tensor, 'exp_avg': ...}}, 'param_groups':
/// [{'lr': ..., 'betas': (...), ..., 'params': [indices]}]}`, where a
/// parameter's index is its position across the groups, in order.
struct OptimizerStateDict {
  /// One group: its options by PyTorch's names ("lr", "betas", ...: doubles,
  /// ints, bools, None, tuples) and its parameters' indices.
  struct ParamGroup {
    std::vector<std::pair<std::string, c10::IValue>> options;
    std::vector<int64_t> params;
  };
  /// The state of each parameter that has one, by index: tensors by
  /// PyTorch's names ("step" is a 0-dimensional float32 tensor, as in
  /// PyTorch 2.x).
  std::map<int64_t, torch::OrderedDict<std::string, at::Tensor>> state;
  std::vector<ParamGroup> param_groups;
  /// The parameters' qualified names, index by index, where known (DCP keys
  /// the state by name); may be empty.
  std::vector<std::string> param_names;
};

/// PyTorch's `optimizer.state_dict()` for a LibTorch Adam, AdamW, SGD,
/// RMSprop or Adagrad (or a ZeroRedundancyOptimizer of one, on the rank it
/// consolidated onto: see consolidate_state_dict). Options that PyTorch has
/// and LibTorch does not (maximize, foreach, ...) are written with
/// PyTorch's defaults. Tensors are aliases of the optimizer's.
/// `param_names`, when given, names the parameters in the optimizer's order.
/// Throws c10::Error for another optimizer type.
OptimizerStateDict optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                        std::vector<std::string> param_names = {});

/// PyTorch's `optimizer.load_state_dict(state)`: the groups' options and
/// every parameter's state (a parameter without state in `state` has none
/// after). Checks first: the number of groups and of parameters in each, the
/// shapes, and options LibTorch cannot honour (maximize=True; AdamW's
/// state into an Adam). For a ZeroRedundancyOptimizer, each rank keeps the
/// state of the parameters it owns. Throws c10::Error naming the problem.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const OptimizerStateDict& state);

} // namespace ddp
