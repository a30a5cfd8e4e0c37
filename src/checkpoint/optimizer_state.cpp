// Optimizer state dicts in PyTorch's layout (state_dict.h): LibTorch's
// Adam, AdamW, SGD, RMSprop and Adagrad, their per-parameter states and
// options, named as PyTorch 2.x names them.
//
// LibTorch keeps a parameter's state in an object of the optimizer's own
// type (AdamParamState: step as an int64, exp_avg, exp_avg_sq,
// max_exp_avg_sq), keyed by the parameter's TensorImpl; PyTorch keeps a
// dict of tensors keyed by the parameter's index, "step" a 0-dimensional
// float32 tensor. The two hold the same numbers: only names and the step's
// type differ, and the options PyTorch has that LibTorch lacks (maximize,
// foreach, capturable, differentiable, fused) are written with PyTorch's
// defaults and refused on load when they ask for something LibTorch does
// not do.

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <ddp/checkpoint/state_dict.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include "checkpoint/optimizer_state.h"
#include "internal/check.h"
#include "internal/torch_compat.h"

namespace ddp {

namespace checkpoint {

namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using Tensors = torch::OrderedDict<std::string, at::Tensor>;
using Options = std::vector<std::pair<std::string, c10::IValue>>;

at::Tensor step_tensor(int64_t step) {
  return at::scalar_tensor(static_cast<double>(step), at::TensorOptions(at::kFloat));
}

void put(Tensors& out, const char* name, const at::Tensor& value) {
  if (value.defined()) {
    out.insert(name, value);
  }
}

c10::IValue betas(const std::tuple<double, double>& value) {
  return c10::ivalue::Tuple::create({std::get<0>(value), std::get<1>(value)});
}

} // namespace

OptimizerKind kind_of(const Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) {
    return OptimizerKind::kAdamW;
  }
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) {
    return OptimizerKind::kAdam;
  }
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) {
    return OptimizerKind::kSGD;
  }
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr) {
    return OptimizerKind::kRMSprop;
  }
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer) != nullptr) {
    return OptimizerKind::kAdagrad;
  }
  if (const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizerBase*>(&optimizer)) {
    return kind_of(const_cast<optim::ZeroRedundancyOptimizerBase*>(zero)->local_optimizer());
  }
  DDP_CHECK(false, "optimizer state dicts: ddp writes PyTorch's layout for LibTorch's Adam, AdamW, SGD, "
                   "RMSprop and Adagrad (and a ZeroRedundancyOptimizer of one); this optimizer is none of them");
}

const char* name_of(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return "Adam";
    case OptimizerKind::kAdamW:
      return "AdamW";
    case OptimizerKind::kSGD:
      return "SGD";
    case OptimizerKind::kRMSprop:
      return "RMSprop";
    case OptimizerKind::kAdagrad:
      return "Adagrad";
  }
  return "optimizer";
}

Tensors export_param_state(const OptimizerParamState& state) {
  Tensors out;
  if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    out.insert("step", step_tensor(s->step()));
    put(out, "exp_avg", s->exp_avg());
    put(out, "exp_avg_sq", s->exp_avg_sq());
    put(out, "max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    out.insert("step", step_tensor(s->step()));
    put(out, "exp_avg", s->exp_avg());
    put(out, "exp_avg_sq", s->exp_avg_sq());
    put(out, "max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    put(out, "momentum_buffer", s->momentum_buffer());
  } else if (const auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    out.insert("step", step_tensor(s->step()));
    put(out, "square_avg", s->square_avg());
    put(out, "momentum_buffer", s->momentum_buffer());
    put(out, "grad_avg", s->grad_avg());
  } else if (const auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&state)) {
    out.insert("step", step_tensor(s->step()));
    put(out, "sum", s->sum());
  } else {
    DDP_CHECK(false, "optimizer state dicts: a parameter state of a type ddp does not know");
  }
  return out;
}

Options export_options(const OptimizerOptions& options) {
  using c10::IValue;
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return {{"lr", o->lr()},          {"betas", betas(o->betas())}, {"eps", o->eps()},
            {"weight_decay", o->weight_decay()}, {"amsgrad", o->amsgrad()}, {"maximize", false},
            {"foreach", IValue()},    {"capturable", false},        {"differentiable", false},
            {"fused", IValue()},      {"decoupled_weight_decay", true}};
  }
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    return {{"lr", o->lr()},          {"betas", betas(o->betas())}, {"eps", o->eps()},
            {"weight_decay", o->weight_decay()}, {"amsgrad", o->amsgrad()}, {"maximize", false},
            {"foreach", IValue()},    {"capturable", false},        {"differentiable", false},
            {"fused", IValue()},      {"decoupled_weight_decay", false}};
  }
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    return {{"lr", o->lr()},           {"momentum", o->momentum()}, {"dampening", o->dampening()},
            {"weight_decay", o->weight_decay()}, {"nesterov", o->nesterov()}, {"maximize", false},
            {"foreach", IValue()},     {"differentiable", false},   {"fused", IValue()}};
  }
  if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    return {{"lr", o->lr()},           {"momentum", o->momentum()}, {"alpha", o->alpha()},
            {"eps", o->eps()},         {"centered", o->centered()}, {"weight_decay", o->weight_decay()},
            {"capturable", false},     {"foreach", IValue()},       {"maximize", false},
            {"differentiable", false}};
  }
  if (const auto* o = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    return {{"lr", o->lr()},           {"lr_decay", o->lr_decay()}, {"eps", o->eps()},
            {"weight_decay", o->weight_decay()}, {"initial_accumulator_value", o->initial_accumulator_value()},
            {"foreach", IValue()},     {"maximize", false},         {"differentiable", false},
            {"fused", IValue()}};
  }
  DDP_CHECK(false, "optimizer state dicts: the options of an optimizer ddp does not know");
}

namespace {

// The number, bool or pair under `key`, checked.
struct OptionReader {
  const Options& options;
  const std::string& who;

  const c10::IValue* find(const char* key) const {
    for (const auto& [k, v] : options) {
      if (k == key) {
        return &v;
      }
    }
    return nullptr;
  }
  template <typename Set>
  void number(const char* key, Set set) const {
    if (const auto* v = find(key)) {
      DDP_CHECK(v->isDouble() || v->isInt(), who, ": option '", key, "' is ", v->tagKind(), ", expected a number");
      set(v->isDouble() ? v->toDouble() : static_cast<double>(v->toInt()));
    }
  }
  template <typename Set>
  void flag(const char* key, Set set) const {
    if (const auto* v = find(key)) {
      DDP_CHECK(v->isBool(), who, ": option '", key, "' is ", v->tagKind(), ", expected True or False");
      set(v->toBool());
    }
  }
  void pair(const char* key, std::tuple<double, double>& out) const {
    if (const auto* v = find(key)) {
      DDP_CHECK(v->isTuple() && v->toTupleRef().elements().size() == 2, who, ": option '", key,
                "' is not a pair of numbers");
      const auto& e = v->toTupleRef().elements();
      auto as_double = [&](const c10::IValue& x) {
        DDP_CHECK(x.isDouble() || x.isInt(), who, ": option '", key, "' is not a pair of numbers");
        return x.isDouble() ? x.toDouble() : static_cast<double>(x.toInt());
      };
      out = std::make_tuple(as_double(e[0]), as_double(e[1]));
    }
  }
  // Options PyTorch has and LibTorch cannot honour.
  void refuse_true(const char* key, const char* why) const {
    if (const auto* v = find(key)) {
      DDP_CHECK(!(v->isBool() && v->toBool()), who, ": option '", key, "' is True, ", why);
    }
  }
};

template <typename AdamLike>
void import_adam_options(AdamLike& o, const OptionReader& r, bool decoupled) {
  r.number("lr", [&](double v) { o.lr(v); });
  r.pair("betas", o.betas());
  r.number("eps", [&](double v) { o.eps(v); });
  r.number("weight_decay", [&](double v) { o.weight_decay(v); });
  r.flag("amsgrad", [&](bool v) { o.amsgrad(v); });
  if (const auto* v = r.find("decoupled_weight_decay")) {
    DDP_CHECK(v->isBool() && v->toBool() == decoupled, r.who, ": the state is of ",
              decoupled ? "Adam (decoupled_weight_decay=False)" : "AdamW (decoupled_weight_decay=True)",
              " and this optimizer is ", decoupled ? "AdamW" : "Adam", "; build the same kind");
  }
}

} // namespace

void import_options(OptimizerOptions& options, const Options& values, const std::string& who) {
  const OptionReader r{values, who};
  r.refuse_true("maximize", "which LibTorch's optimizers do not do");
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    import_adam_options(*o, r, true);
  } else if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    import_adam_options(*o, r, false);
  } else if (auto* o = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    r.number("lr", [&](double v) { o->lr(v); });
    r.number("momentum", [&](double v) { o->momentum(v); });
    r.number("dampening", [&](double v) { o->dampening(v); });
    r.number("weight_decay", [&](double v) { o->weight_decay(v); });
    r.flag("nesterov", [&](bool v) { o->nesterov(v); });
  } else if (auto* o = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    r.number("lr", [&](double v) { o->lr(v); });
    r.number("momentum", [&](double v) { o->momentum(v); });
    r.number("alpha", [&](double v) { o->alpha(v); });
    r.number("eps", [&](double v) { o->eps(v); });
    r.flag("centered", [&](bool v) { o->centered(v); });
    r.number("weight_decay", [&](double v) { o->weight_decay(v); });
  } else if (auto* o = dynamic_cast<torch::optim::AdagradOptions*>(&options)) {
    r.number("lr", [&](double v) { o->lr(v); });
    r.number("lr_decay", [&](double v) { o->lr_decay(v); });
    r.number("eps", [&](double v) { o->eps(v); });
    r.number("weight_decay", [&](double v) { o->weight_decay(v); });
    r.number("initial_accumulator_value", [&](double v) { o->initial_accumulator_value(v); });
  } else {
    DDP_CHECK(false, who, ": the options of an optimizer ddp does not know");
  }
}

namespace {

// The tensor `name` of a parameter's state, checked against the parameter
// and cast to its dtype and device, or undefined when absent and optional.
at::Tensor take(const Tensors& values, const char* name, const at::Tensor& param, bool required,
                const std::string& who) {
  const at::Tensor* v = values.find(name);
  if (v == nullptr || !v->defined()) {
    DDP_CHECK(!required, who, ": the state has no '", name, "'");
    return {};
  }
  DDP_CHECK(v->sizes() == param.sizes(), who, ": '", name, "' has shape ", v->sizes(), ", the parameter's is ",
            param.sizes());
  return v->detach().to(param.options().requires_grad(false), /*non_blocking=*/false, /*copy=*/true);
}

int64_t take_step(const Tensors& values, const std::string& who) {
  const at::Tensor* v = values.find("step");
  DDP_CHECK(v != nullptr && v->defined(), who, ": the state has no 'step'");
  DDP_CHECK(v->numel() == 1, who, ": 'step' has ", v->numel(), " elements, expected 1");
  const double step = v->to(at::kDouble).item<double>();
  DDP_CHECK(step >= 0 && step == static_cast<double>(static_cast<int64_t>(step)), who, ": 'step' is ", step,
            ", expected a whole number");
  return static_cast<int64_t>(step);
}

void check_known(const Tensors& values, std::initializer_list<const char*> known, const std::string& who) {
  for (const auto& item : values) {
    bool ok = false;
    for (const char* k : known) {
      ok = ok || item.key() == k;
    }
    DDP_CHECK(ok, who, ": the state has '", item.key(), "', which this optimizer does not keep");
  }
}

} // namespace

std::unique_ptr<OptimizerParamState> import_param_state(OptimizerKind kind, const OptimizerOptions& options,
                                                        const Tensors& values, const at::Tensor& param,
                                                        const std::string& who) {
  switch (kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      check_known(values, {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, who);
      const bool amsgrad = kind == OptimizerKind::kAdam
          ? static_cast<const torch::optim::AdamOptions&>(options).amsgrad()
          : static_cast<const torch::optim::AdamWOptions&>(options).amsgrad();
      auto fill = [&](auto state) {
        state->step(take_step(values, who));
        state->exp_avg(take(values, "exp_avg", param, true, who));
        state->exp_avg_sq(take(values, "exp_avg_sq", param, true, who));
        auto max = take(values, "max_exp_avg_sq", param, amsgrad, who);
        if (max.defined()) {
          state->max_exp_avg_sq(max);
        }
        return std::unique_ptr<OptimizerParamState>(std::move(state));
      };
      if (kind == OptimizerKind::kAdam) {
        return fill(std::make_unique<torch::optim::AdamParamState>());
      }
      return fill(std::make_unique<torch::optim::AdamWParamState>());
    }
    case OptimizerKind::kSGD: {
      check_known(values, {"momentum_buffer"}, who);
      auto buffer = take(values, "momentum_buffer", param, false, who);
      if (!buffer.defined()) {
        return nullptr; // momentum 0: PyTorch 2.x keeps no state, 1.13 a None buffer
      }
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(buffer);
      return state;
    }
    case OptimizerKind::kRMSprop: {
      check_known(values, {"step", "square_avg", "momentum_buffer", "grad_avg"}, who);
      const auto& o = static_cast<const torch::optim::RMSpropOptions&>(options);
      auto state = std::make_unique<torch::optim::RMSpropParamState>();
      state->step(take_step(values, who));
      state->square_avg(take(values, "square_avg", param, true, who));
      auto momentum = take(values, "momentum_buffer", param, o.momentum() > 0, who);
      if (momentum.defined()) {
        state->momentum_buffer(momentum);
      }
      auto grad_avg = take(values, "grad_avg", param, o.centered(), who);
      if (grad_avg.defined()) {
        state->grad_avg(grad_avg);
      }
      return state;
    }
    case OptimizerKind::kAdagrad: {
      check_known(values, {"step", "sum"}, who);
      auto state = std::make_unique<torch::optim::AdagradParamState>();
      state->step(take_step(values, who));
      state->sum(take(values, "sum", param, true, who));
      return state;
    }
  }
  return nullptr;
}

void set_step(OptimizerParamState& state, int64_t step) {
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    s->step(step);
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    s->step(step);
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(&state)) {
    s->step(step);
  } else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(&state)) {
    s->step(step);
  }
}

void set_param_state(Optimizer& optimizer, const at::Tensor& param, std::unique_ptr<OptimizerParamState> state) {
  auto& map = optimizer.state();
  const auto key = internal::state_key(map, param);
  if (state) {
    map[key] = std::move(state);
  } else {
    map.erase(key);
  }
}

const OptimizerParamState* param_state(const Optimizer& optimizer, const at::Tensor& param) {
  const auto& map = optimizer.state();
  const auto found = map.find(internal::state_key(map, param));
  return found == map.end() ? nullptr : found->second.get();
}

} // namespace checkpoint

OptimizerStateDict optimizer_state_dict(const torch::optim::Optimizer& optimizer, std::vector<std::string> param_names) {
  const torch::optim::Optimizer* source = &optimizer;
  if (const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizerBase*>(&optimizer)) {
    source = &zero->consolidated(); // throws, saying why, on the other ranks
  }
  checkpoint::kind_of(*source);
  OptimizerStateDict out;
  int64_t index = 0;
  for (const auto& group : source->param_groups()) {
    OptimizerStateDict::ParamGroup g;
    g.options = checkpoint::export_options(group.options());
    for (const auto& p : group.params()) {
      if (const auto* state = checkpoint::param_state(*source, p)) {
        out.state.emplace(index, checkpoint::export_param_state(*state));
      }
      g.params.push_back(index++);
    }
    out.param_groups.push_back(std::move(g));
  }
  DDP_CHECK(param_names.empty() || static_cast<int64_t>(param_names.size()) == index,
            "optimizer_state_dict: ", param_names.size(), " parameter names for an optimizer of ", index,
            " parameters");
  out.param_names = std::move(param_names);
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const OptimizerStateDict& state) {
  const std::string who = "load_optimizer_state_dict";
  auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizerBase*>(&optimizer);
  torch::optim::Optimizer& holder = zero != nullptr ? zero->local_optimizer() : optimizer;
  const auto kind = checkpoint::kind_of(holder);
  auto& groups = optimizer.param_groups();
  DDP_CHECK(groups.size() == state.param_groups.size(), who, ": the state has ", state.param_groups.size(),
            " parameter groups, this ", checkpoint::name_of(kind), " has ", groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    DDP_CHECK(groups[g].params().size() == state.param_groups[g].params.size(), who, ": parameter group ", g,
              " of the state has ", state.param_groups[g].params.size(), " parameters, this ",
              checkpoint::name_of(kind), "'s has ", groups[g].params().size());
  }
  // Everything is built and checked first; nothing changes on an error.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  for (size_t g = 0; g < groups.size(); ++g) {
    options.push_back(groups[g].options().clone());
    checkpoint::import_options(*options.back(), state.param_groups[g].options, c10::str(who, ": group ", g));
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      const int64_t id = state.param_groups[g].params[i];
      if (zero != nullptr && zero->owner_of(p) != zero->process_group()->rank()) {
        continue; // another rank's shard
      }
      const auto found = state.state.find(id);
      std::unique_ptr<torch::optim::OptimizerParamState> ps;
      if (found != state.state.end()) {
        const std::string name = static_cast<size_t>(id) < state.param_names.size()
            ? state.param_names[static_cast<size_t>(id)]
            : c10::str(id);
        ps = checkpoint::import_param_state(kind, *options.back(), found->second, p,
                                            c10::str(who, ": parameter ", name, " (group ", g, ", index ", i, ")"));
      }
      states.emplace_back(p, std::move(ps));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].set_options(std::move(options[g]));
  }
  for (auto& [p, ps] : states) {
    checkpoint::set_param_state(holder, p, std::move(ps));
  }
}

} // namespace ddp
