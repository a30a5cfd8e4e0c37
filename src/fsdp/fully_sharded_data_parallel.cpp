// FullyShardedDataParallel: construction (finding the units, checking them
// across ranks, sharding) and the iteration (see the narrative in
// fsdp_state.h).

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_set>

#include <ddp/group.h>
#include <ddp/init.h>
#include <ddp/nn/deferred_init.h>
#include <ddp/nn/fully_sharded_data_parallel.h>

#include "checkpoint/names.h"
#include "fsdp/auto_wrap.h"
#include "comm/objects/same_on_every_rank.h"
#include "fsdp/construction_checks.h"
#include "fsdp/fsdp_state.h"
#include "internal/check.h"
#include "internal/env.h"
#include "nn/sync_batch_norm_internal.h"
#include "plan/plan_recorder.h"
#include "timeline/timeline.h"

namespace ddp {

namespace {

using fsdp::FlatEntry;
using fsdp::FlatUnit;
using State = FullyShardedDataParallelImpl::State;

// A unit before sharding: its label and its parameters by first name.
struct UnitPlan {
  std::string label;
  std::vector<FlatEntry> entries;
  std::shared_ptr<FsdpUnitImpl> unit_module; // custom modules only
  at::Tensor shard;                          // a deferred unit's, taken when built
};

// Which unit claims each parameter (by TensorImpl), to refuse sharing.
class Claims {
 public:
  explicit Claims(std::string who) : who_(std::move(who)) {}

  // Adds `param` (named `name`) to `plan`, unless the plan holds it already
  // under another name (then `name` is an alias, recorded by the caller).
  void claim(UnitPlan& plan, const std::string& name, const at::Tensor& param) {
    const auto* impl = param.unsafeGetTensorImpl();
    const auto found = owner_.find(impl);
    if (found != owner_.end()) {
      DDP_CHECK(found->second.first == plan.label, who_, ": parameter ", name, " is shared between unit ",
                found->second.first, " (as ", found->second.second, ") and unit ", plan.label,
                "; a parameter must belong to one unit: put the modules that share it in the same unit");
      return;
    }
    owner_.emplace(impl, std::make_pair(plan.label, name));
    FlatEntry entry;
    entry.name = name;
    entry.param = param;
    plan.entries.push_back(std::move(entry));
  }

  bool claimed(const at::Tensor& param) const { return owner_.count(param.unsafeGetTensorImpl()) > 0; }

 private:
  std::string who_;
  std::unordered_map<const void*, std::pair<std::string, std::string>> owner_;
};

// Every FsdpUnit inside `module` (not `module` itself), with its path.
std::vector<std::pair<std::string, std::shared_ptr<FsdpUnitImpl>>> units_inside(
    const std::shared_ptr<torch::nn::Module>& module, const std::string& prefix) {
  std::vector<std::pair<std::string, std::shared_ptr<FsdpUnitImpl>>> found;
  for (const auto& item : module->named_modules(prefix, /*include_self=*/false)) {
    if (auto unit = std::dynamic_pointer_cast<FsdpUnitImpl>(item.value())) {
      found.emplace_back(item.key(), std::move(unit));
    }
  }
  return found;
}

std::string join_prefix(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The steps of construction, in order (FullyShardedDataParallelImpl's
// constructor).

// The strategy's shard and replicate groups, the offload and precision
// settings, and the split of the gradient's division by the world size.
void choose_groups(State& s, const FullyShardedDataParallelOptions& options) {
  const std::string& who = s.config.who;
  switch (options.sharding_strategy()) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      s.config.shard_group = s.group;
      break;
    case ShardingStrategy::kNoShard:
      s.config.replicate_group = s.group;
      break;
    case ShardingStrategy::kHybridShard: {
      s.config.shard_group = options.shard_group();
      s.config.replicate_group = options.replicate_group();
      DDP_CHECK(static_cast<bool>(s.config.shard_group) == static_cast<bool>(s.config.replicate_group), who,
                ": kHybridShard takes both shard_group and replicate_group, or neither (got only the ",
                s.config.shard_group ? "shard_group" : "replicate_group", ")");
      if (!s.config.shard_group) {
        // The launcher's ranks per node: LOCAL_WORLD_SIZE (ddprun, torchrun),
        // Slurm's or Open MPI's own (a world of size 1 without one).
        const int node = world_info_from_env().local_world_size;
        const int world = s.group->size();
        DDP_CHECK(node >= 1 && world % node == 0, who, ": kHybridShard: ", node,
                  " ranks per node (the launcher's local world size) do not divide the world size ", world,
                  "; pass shard_group and replicate_group");
        DDP_CHECK(s.group == default_process_group(), who,
                  ": kHybridShard makes its groups from the default group; pass shard_group and "
                  "replicate_group for another group");
        s.config.shard_group = new_subgroups(node).mine;
        for (int position = 0; position < node; ++position) {
          std::vector<int> across;
          for (int r = position; r < world; r += node) {
            across.push_back(r);
          }
          auto made = new_group(across);
          if (s.group->rank() % node == position) {
            s.config.replicate_group = made;
          }
        }
      }
      break;
    }
  }
  s.config.offload_params = options.cpu_offload().offload_params();
  s.config.param_dtype = options.mixed_precision().param_dtype();
  s.config.reduce_dtype = options.mixed_precision().reduce_dtype();
  // PyTorch's split of the division by the world size around the reduction
  // (_get_gradient_predivide_factor): the larger power of two below
  // sqrt(world) before, the rest after, so that low-precision sums neither
  // overflow nor underflow.
  const int world = s.group->size();
  int factor = 1;
  while (world % factor == 0 && world / factor > factor) {
    factor *= 2;
  }
  s.config.predivide = factor;
  s.config.postdivide = static_cast<double>(world) / factor;
}

// The units: the FsdpUnits inside the module, or the Sequential's children
// (among them, or inside them, those an auto_wrap_policy chooses), then the
// root unit of what no unit holds. Deferred units are built, initialised
// and sharded here. Sets s.unit_of_child and s.root_unit.
std::vector<UnitPlan> plan_units(State& s, const FullyShardedDataParallelOptions& options,
                                 const std::shared_ptr<torch::nn::Module>& module,
                                 const std::shared_ptr<torch::nn::SequentialImpl>& sequential) {
  const std::string& who = s.config.who;
  Claims claims(who);
  std::vector<UnitPlan> plans;
  const auto& policy = options.auto_wrap_policy();
  // The FsdpUnits inside `module` (at `prefix`) as units.
  auto add_units_inside = [&](const std::shared_ptr<torch::nn::Module>& holder, const std::string& prefix) {
    for (const auto& [path, unit] : units_inside(holder, prefix)) {
      const auto nested = units_inside(unit, path);
      DDP_CHECK(nested.empty(), who, ": unit ", nested.empty() ? path : nested.front().first,
                " is nested in unit ", path, "; units must not nest: wrap the inner module or the outer one");
      const bool deferred = !unit->built();
      if (deferred) {
        // Built, initialised and sharded now: its full values exist only
        // until this rank's shard is taken.
        DDP_CHECK(options.param_init(), who, ": unit ", path,
                  " is deferred (ddp::deferred_unit) and nothing says how to initialise it: pass "
                  "FullyShardedDataParallelOptions().param_init(ddp::ParamInit().seed(...))");
        unit->build();
        seeded_init(*unit->module(), *options.param_init(), path);
        unit->module()->to(options.param_init()->device());
      }
      UnitPlan plan{path, {}, unit, {}};
      for (const auto& item : unit->named_parameters()) {
        claims.claim(plan, join_prefix(path, item.key()), item.value());
      }
      if (deferred && !plan.entries.empty()) {
        const auto& group = s.config.shard_group;
        plan.shard = fsdp::take_shard(plan.entries, group ? group->size() : 1, group ? group->rank() : 0);
      }
      if (!plan.entries.empty()) {
        plans.push_back(std::move(plan));
      }
    }
  };
  if (options.param_init()) {
    // What is built; deferred units as they are built below.
    seeded_init(*module, *options.param_init());
  }
  if (sequential) {
    for (size_t i = 0; i < sequential->size(); ++i) {
      auto child = sequential->ptr(i);
      const std::string path = std::to_string(i);
      if (policy) {
        // The policy chooses among the children; inside those it leaves
        // out, among the children of their Sequentials.
        const bool holds = fsdp::auto_wrap(*child, path, policy);
        if (holds || !policy(path, *child, fsdp::parameter_numel(*child))) {
          s.unit_of_child.push_back(-1);
          add_units_inside(child, path);
          continue;
        }
      } else {
        const auto nested = units_inside(child, path);
        DDP_CHECK(nested.empty() && !std::dynamic_pointer_cast<FsdpUnitImpl>(child), who,
                  ": the Sequential's child ", path, " holds an FsdpUnit (",
                  nested.empty() ? path : nested.front().first,
                  "); each child of a Sequential is a unit already: remove the FsdpUnit, or pass an "
                  "auto_wrap_policy to choose the units");
      }
      UnitPlan plan{"child " + path, {}, nullptr, {}};
      for (const auto& item : child->named_parameters()) {
        claims.claim(plan, join_prefix(path, item.key()), item.value());
      }
      s.unit_of_child.push_back(plan.entries.empty() ? -1 : static_cast<int>(plans.size()));
      if (!plan.entries.empty()) {
        plans.push_back(std::move(plan));
      }
    }
  } else {
    if (policy) {
      fsdp::auto_wrap(*module, "", policy);
    }
    add_units_inside(module, "");
  }
  {
    // What no unit holds: the root unit. A parameter that a unit holds and
    // another module (outside every unit) uses too is shared.
    std::unordered_set<std::string> in_units;
    for (const auto& plan : plans) {
      for (const auto& entry : plan.entries) {
        in_units.insert(entry.name);
      }
    }
    UnitPlan root{"(root)", {}, nullptr, {}};
    for (const auto& item : module->named_parameters()) {
      const bool inside = std::any_of(plans.begin(), plans.end(), [&](const UnitPlan& plan) {
        return plan.unit_module && item.key().rfind(plan.label + ".", 0) == 0;
      });
      if (in_units.count(item.key()) > 0 || inside) {
        continue;
      }
      DDP_CHECK(!claims.claimed(item.value()), who, ": parameter ", item.key(),
                " is used outside every unit but belongs to a unit too; a parameter must belong to one unit");
      claims.claim(root, item.key(), item.value());
    }
    if (!root.entries.empty()) {
      s.root_unit = static_cast<int>(plans.size());
      plans.push_back(std::move(root));
    }
  }
  return plans;
}

// Every rank wraps the same units (internal::check_same_on_every_rank) and
// holds the same initial values, or takes rank 0's (sync_module_states).
void agree_across_ranks(const State& s, const std::vector<UnitPlan>& plans, torch::nn::Module& module,
                        const FullyShardedDataParallelOptions& options) {
  if (s.group->size() == 1) {
    return;
  }
  c10::Device device(c10::kCPU);
  std::vector<std::string> lines{c10::str("'strategy ", to_string(options.sharding_strategy()), "'")};
  if (options.param_init()) {
    lines.push_back(c10::str("'param_init seed ", options.param_init()->seed(), "'"));
  }
  for (const auto& plan : plans) {
    for (const auto& entry : plan.entries) {
      lines.push_back(c10::str("'", entry.name, " ",
                               entry.laid_out ? c10::IntArrayRef(entry.shape) : entry.param.sizes(), " ",
                               entry.param.scalar_type(), " ", c10::DeviceTypeName(entry.param.device().type()),
                               " in unit ", plan.label, "'"));
      device = entry.param.device();
    }
  }
  internal::check_same_on_every_rank(*s.group, lines, device,
                                     {s.config.who, "ranks wrap different units", "line",
                                      "Every rank must wrap the same model, with the same units and options."});
  if (!options.sync_module_states()) {
    fsdp::check_same_values(module, *s.group, device, s.config.who);
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& tensor : module.parameters()) {
    s.group->broadcast(tensor.detach(), BroadcastOptions{0})->wait();
  }
  for (auto& tensor : module.buffers()) {
    s.group->broadcast(tensor, BroadcastOptions{0})->wait();
  }
}

// The buffer pool, which keeps up to four blocks of the largest unit, and
// the reduce buffers in shared memory where the shard group reduces there.
void size_buffers(State& s, const std::vector<UnitPlan>& plans) {
  size_t largest = 0;
  for (const auto& plan : plans) {
    size_t bytes = 0;
    for (const auto& entry : plan.entries) {
      const size_t item = std::max({static_cast<size_t>(entry.param.element_size()),
                                    c10::elementSize(s.config.param_dtype.value_or(entry.param.scalar_type())),
                                    c10::elementSize(s.config.reduce_dtype.value_or(entry.param.scalar_type()))});
      bytes += static_cast<size_t>(entry.laid_out ? entry.numel : entry.param.numel()) * item;
    }
    largest = std::max(largest, bytes);
  }
  s.config.pool = std::make_shared<fsdp::BufferPool>(4 * largest + 4096);
  static_assert(fsdp::kSharedReduceSlots == kReductionsInFlight + 1, "see SharedReduceBuffers");
  if (s.config.shard_group && s.config.shard_group->size() > 1 && s.config.shard_group->reduces_in_shared_memory() &&
      !plans.empty() && plans.front().entries.front().param.device().is_cpu()) {
    // See SharedReduceBuffers (flat_unit.h). Other backends reduce-scatter:
    // Gloo's own reduce-scatter moves half of what an allreduce moves.
    auto shared = std::make_shared<fsdp::SharedReduceBuffers>();
    shared->dtype = s.config.reduce_dtype.value_or(
        s.config.param_dtype.value_or(plans.front().entries.front().param.scalar_type()));
    for (const auto& plan : plans) {
      int64_t total = 0;
      for (const auto& entry : plan.entries) {
        total += entry.laid_out ? entry.numel : entry.param.numel();
      }
      const int64_t world = s.config.shard_group->size();
      shared->numel = std::max(shared->numel, (total + world - 1) / world * world);
    }
    // Note [Gathered in common memory]: on every rank or on none.
    const bool wanted = internal::env_get(internal::kEnvFsdpCommonGather).value_or("1") != "0";
    auto agreed = at::full({1}, wanted ? int64_t{1} : int64_t{0}, at::kLong);
    s.config.shard_group->allreduce(agreed, AllreduceOptions{ReduceOp::kMin})->wait();
    shared->common_gather = agreed.item<int64_t>() == 1;
    s.config.shared_reduce = std::move(shared);
  }
}

// Names under which a unit's parameter is held a second time.
void record_aliases(State& s, torch::nn::Module& module) {
  for (const auto& item : module.named_parameters()) {
    if (s.where.count(item.key()) > 0) {
      continue;
    }
    for (size_t u = 0; u < s.units.size(); ++u) {
      const auto& entries = s.units[u]->entries();
      for (size_t e = 0; e < entries.size(); ++e) {
        if (entries[e].param.unsafeGetTensorImpl() == item.value().unsafeGetTensorImpl()) {
          s.where[item.key()] = {u, e};
        }
      }
    }
  }
}

} // namespace

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "kFullShard";
    case ShardingStrategy::kShardGradOp:
      return "kShardGradOp";
    case ShardingStrategy::kNoShard:
      return "kNoShard";
    case ShardingStrategy::kHybridShard:
      return "kHybridShard";
  }
  return "(unknown ShardingStrategy)";
}

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle:
      return "idle";
    case TrainingState::kForward:
      return "forward";
    case TrainingState::kPreBackward:
      return "pre-backward";
    case TrainingState::kPostBackward:
      return "post-backward";
  }
  return "(unknown TrainingState)";
}

// ---- FsdpUnit and the no_sync guard ----

void FsdpUnitImpl::pre_forward() {
  auto root = state_->root.lock();
  DDP_CHECK(root, "FsdpUnit: the FullyShardedDataParallel that wrapped this unit was destroyed; its "
                  "parameters went with it");
  DDP_CHECK(root->in_forward, root->config.who, ": unit ", root->units[state_->unit]->label(),
            " was called outside the forward of the FullyShardedDataParallel that wraps it; its "
            "parameters are sharded between calls: call the wrapping model instead");
  root->unit_pre_forward(state_->unit, -1);
}

void FsdpUnitImpl::post_forward(std::vector<at::Tensor>& outputs) {
  if (auto root = state_->root.lock()) {
    root->unit_post_forward(state_->unit, outputs);
  }
}

FsdpNoSyncGuard::FsdpNoSyncGuard(std::shared_ptr<bool> flag) : flag_(std::move(flag)) {
  *flag_ = true;
}

FsdpNoSyncGuard::FsdpNoSyncGuard(FsdpNoSyncGuard&& other) noexcept : flag_(std::move(other.flag_)) {}

FsdpNoSyncGuard::~FsdpNoSyncGuard() {
  if (flag_) {
    *flag_ = false;
  }
}

// ---- Construction ----

FullyShardedDataParallelImpl::FullyShardedDataParallelImpl(const torch::nn::Sequential& module,
                                                           const FullyShardedDataParallelOptions& options)
    : FullyShardedDataParallelImpl(torch::nn::AnyModule(), module.ptr(), module.ptr(), options) {}

FullyShardedDataParallelImpl::FullyShardedDataParallelImpl(
    torch::nn::AnyModule any, std::shared_ptr<torch::nn::SequentialImpl> sequential,
    std::shared_ptr<torch::nn::Module> module, const FullyShardedDataParallelOptions& options)
    : any_(std::move(any)), sequential_(std::move(sequential)), module_(std::move(module)),
      state_(std::make_shared<State>()) {
  State& s = *state_;
  s.options = options;
  s.group = options.process_group() ? options.process_group() : default_process_group();
  DDP_CHECK(s.group, "FullyShardedDataParallel: no process group; call ddp::init_process_group() first or "
                     "pass FullyShardedDataParallelOptions().process_group(...)");
  s.config.who = c10::str("[rank ", s.group->rank(), "/", s.group->size(), "] FullyShardedDataParallel");
  choose_groups(s, options);
  std::vector<UnitPlan> plans = plan_units(s, options, module_, sequential_);
  agree_across_ranks(s, plans, *module_, options);
  size_buffers(s, plans);
  for (size_t u = 0; u < plans.size(); ++u) {
    auto& plan = plans[u];
    for (size_t e = 0; e < plan.entries.size(); ++e) {
      s.where[plan.entries[e].name] = {u, e};
    }
    // The plan lets go of a deferred unit's shard: one copy of it at a time.
    s.units.push_back(
        std::make_unique<FlatUnit>(plan.label, std::move(plan.entries), s.config, std::move(plan.shard)));
    register_parameter("flat_param_" + std::to_string(u), s.units.back()->shard(),
                       s.units.back()->shard().requires_grad());
    if (plan.unit_module) {
      plan.unit_module->state_ = std::make_shared<detail::FsdpUnitState>(state_, u);
      s.unit_modules.push_back(plan.unit_module);
    }
  }
  record_aliases(s, *module_);
  s.training.assign(s.units.size(), TrainingState::kIdle);
}

FullyShardedDataParallelImpl::~FullyShardedDataParallelImpl() {
  for (auto& unit : state_->unit_modules) {
    unit->state_.reset();
  }
}

FsdpNoSyncGuard FullyShardedDataParallelImpl::no_sync() {
  return FsdpNoSyncGuard(state_->no_sync);
}

const std::shared_ptr<ProcessGroup>& FullyShardedDataParallelImpl::shard_group() const {
  return state_->config.shard_group;
}

const std::shared_ptr<ProcessGroup>& FullyShardedDataParallelImpl::replicate_group() const {
  return state_->config.replicate_group;
}

size_t FullyShardedDataParallelImpl::num_units() const {
  return state_->units.size();
}

std::vector<std::string> FullyShardedDataParallelImpl::unit_parameter_names(size_t unit) const {
  DDP_CHECK(unit < state_->units.size(), state_->config.who, ": unit ", unit, " does not exist (there are ",
            state_->units.size(), ")");
  std::vector<std::string> names;
  for (const auto& entry : state_->units[unit]->entries()) {
    names.push_back(entry.name);
  }
  return names;
}

std::string FullyShardedDataParallelImpl::unit_label(size_t unit) const {
  DDP_CHECK(unit < state_->units.size(), state_->config.who, ": unit ", unit, " does not exist (there are ",
            state_->units.size(), ")");
  return state_->units[unit]->label();
}

void FullyShardedDataParallelImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

at::Tensor FullyShardedDataParallelImpl::cast_tensor(const at::Tensor& value) const {
  const auto& dtype = state_->config.param_dtype;
  if (dtype && value.defined() && value.is_floating_point() && value.scalar_type() != *dtype) {
    return value.to(*dtype);
  }
  return value;
}

// ---- The iteration ----

void FullyShardedDataParallelImpl::begin_forward() {
  State& s = *state_;
  DDP_CHECK(!s.in_forward, s.config.who, ": forward called from inside its own forward");
  s.in_forward = true;
  nn::detail::enable_batch_norms_in_place(); // Note [BatchNorms synchronised in place]
  if (torch::GradMode::is_enabled()) {
    internal::plan_begin_step(); // Note [Plan report]: steps as the timeline's
  }
  if (internal::Timeline* timeline = internal::Timeline::get(); timeline && torch::GradMode::is_enabled()) {
    timeline->begin_step(); // Note [Timeline]: a step begins with a forward with gradients, as in DDP
    s.timeline_forward_start_us = internal::Timeline::now_us();
  }
  for (auto& unit : s.units) {
    unit->mark_stale();
    unit->reset_backward();
  }
  if (!s.forward_order.empty()) {
    s.last_forward_order = s.forward_order;
  }
  s.forward_order.clear();
  std::fill(s.training.begin(), s.training.end(), TrainingState::kIdle);
  s.next_reduce = 0;
  s.pending_free = -1;
  if (s.root_unit >= 0) {
    s.unit_pre_forward(static_cast<size_t>(s.root_unit), -1);
  }
}

void FullyShardedDataParallelImpl::end_forward() noexcept {
  State& s = *state_;
  s.in_forward = false;
  if (s.timeline_forward_start_us != 0) {
    try {
      internal::Timeline::get()->complete(internal::Timeline::kStepTrack, "forward", s.timeline_forward_start_us,
                                          internal::Timeline::now_us());
    } catch (...) {
      // Out of memory for one event: the timeline goes without it.
    }
    s.timeline_forward_start_us = 0;
  }
  if (s.root_unit >= 0 && !torch::GradMode::is_enabled() && s.frees_after_backward()) {
    try {
      s.units[static_cast<size_t>(s.root_unit)]->free_full();
    } catch (...) {
      // A failed gather is reported by the forward that waited for it.
    }
  }
}

void FullyShardedDataParallelImpl::root_post_forward(std::vector<at::Tensor>& outputs) {
  State& s = *state_;
  // Hooks the output so that the first step of backward queues the final
  // callback, whatever the units' outputs were.
  s.unit_post_forward(s.root_unit >= 0 ? static_cast<size_t>(s.root_unit) : s.units.size(), outputs);
}

void FullyShardedDataParallelImpl::sequential_pre_forward(size_t child) {
  State& s = *state_;
  const int unit = s.unit_of_child[child];
  if (unit < 0) {
    return;
  }
  int next = -1;
  for (size_t c = child + 1; c < s.unit_of_child.size() && next < 0; ++c) {
    next = s.unit_of_child[c];
  }
  s.unit_pre_forward(static_cast<size_t>(unit), next);
}

void FullyShardedDataParallelImpl::sequential_post_forward(size_t child, torch::nn::AnyValue& output) {
  State& s = *state_;
  std::vector<at::Tensor> tensors;
  if (auto* tensor = output.try_get<at::Tensor>()) {
    tensors.push_back(*tensor);
  } else if (auto* list = output.try_get<std::vector<at::Tensor>>()) {
    tensors = *list;
  }
  const int unit = s.unit_of_child[child];
  if (unit >= 0) {
    s.unit_post_forward(static_cast<size_t>(unit), tensors);
  }
  if (child + 1 == s.unit_of_child.size()) {
    root_post_forward(tensors);
  }
}

int State::next_in_last_order(size_t unit) const {
  const auto at = std::find(last_forward_order.begin(), last_forward_order.end(), unit);
  if (at == last_forward_order.end() || at + 1 == last_forward_order.end()) {
    return -1;
  }
  return static_cast<int>(*(at + 1));
}

bool State::in_forward_order(size_t unit) const {
  return std::find(forward_order.begin(), forward_order.end(), unit) != forward_order.end();
}

void State::unit_pre_forward(size_t unit, int next_unit) {
  FlatUnit& flat = *units[unit];
  flat.ensure_gathered();
  training[unit] = TrainingState::kForward;
  if (torch::GradMode::is_enabled() && flat.shard().requires_grad()) {
    if (!in_forward_order(unit)) {
      forward_order.push_back(unit);
    }
    flat.hook_gradients([this, unit] { unit_ready(unit); });
  }
  if (options.forward_prefetch()) {
    const int next = next_unit >= 0 ? next_unit : next_in_last_order(unit);
    if (next >= 0 && !units[static_cast<size_t>(next)]->fresh()) {
      units[static_cast<size_t>(next)]->start_gather();
    }
  }
}

void State::unit_post_forward(size_t unit, std::vector<at::Tensor>& outputs) {
  bool hooked = false;
  if (torch::GradMode::is_enabled()) {
    std::weak_ptr<State> weak = weak_from_this();
    for (auto& output : outputs) {
      if (output.defined() && output.requires_grad()) {
        // Runs on the autograd engine's thread, before the backward of the
        // node that made `output`.
        output.register_hook([weak, unit](const at::Tensor&) {
          if (auto state = weak.lock()) {
            state->pre_backward(unit);
          }
        });
        hooked = true;
      }
    }
  }
  if (unit >= units.size()) {
    return;
  }
  training[unit] = TrainingState::kIdle;
  if (static_cast<int>(unit) == root_unit) {
    return;
  }
  // Without a hooked output, backward would reach the unit ungathered:
  // keep it until the end of backward.
  if (!torch::GradMode::is_enabled()) {
    if (frees_after_backward()) {
      units[unit]->free_full(); // no backward comes
    }
  } else if (hooked && frees_after_forward()) {
    // Freed when the next unit's forward ends: the unit that runs last is
    // the first whose backward runs, and stays gathered for it.
    if (pending_free >= 0 && static_cast<size_t>(pending_free) != unit) {
      units[static_cast<size_t>(pending_free)]->free_full();
    }
    pending_free = static_cast<int>(unit);
  }
}

void State::pre_backward(size_t unit) {
  if (!callback_queued) {
    callback_queued = true;
    std::weak_ptr<State> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto state = weak.lock()) {
        state->finish_backward();
      }
    });
  }
  if (unit >= units.size()) {
    return;
  }
  if (training[unit] == TrainingState::kPreBackward) {
    // Another of its outputs (a unit called twice, a model called twice
    // before one backward): still gathered, unless an optimizer or a load
    // touched it in between. A checkpointed module recomputes with it.
    if (units[unit]->state() == FlatUnit::State::kSharded) {
      units[unit]->ensure_gathered();
    }
    return;
  }
  if (training[unit] == TrainingState::kPostBackward) {
    return;
  }
  training[unit] = TrainingState::kPreBackward;
  units[unit]->ensure_gathered();
  if (options.backward_prefetch()) {
    const auto at = std::find(forward_order.begin(), forward_order.end(), unit);
    if (at != forward_order.end() && at != forward_order.begin()) {
      FlatUnit& previous = *units[*(at - 1)];
      if (training[*(at - 1)] != TrainingState::kPreBackward &&
          training[*(at - 1)] != TrainingState::kPostBackward && previous.state() == FlatUnit::State::kSharded) {
        previous.start_gather();
      }
    }
  }
}

void State::unit_ready(size_t unit) {
  training[unit] = TrainingState::kPostBackward;
  flush_reductions();
}

void State::flush_reductions() {
  while (next_reduce < forward_order.size()) {
    const size_t unit = forward_order[forward_order.size() - 1 - next_reduce];
    if (training[unit] != TrainingState::kPostBackward) {
      return;
    }
    ++next_reduce;
    if (!*no_sync) {
      units[unit]->start_reduce();
      reducing.push_back(unit);
      // Each reduction holds a full gradient of its unit: bounded, so that
      // backward's peak is a few units, not the whole model.
      while (reducing.size() > kReductionsInFlight) {
        units[reducing.front()]->finish_reduce();
        reducing.pop_front();
      }
    }
    if (frees_after_backward()) {
      units[unit]->free_full();
    }
  }
}

void State::finish_backward() {
  callback_queued = false;
  pending_free = -1;
  for (const size_t unit : forward_order) {
    training[unit] = TrainingState::kPostBackward;
  }
  flush_reductions();
  while (!reducing.empty()) {
    units[reducing.front()]->finish_reduce();
    reducing.pop_front();
  }
  if (frees_after_backward()) {
    for (auto& unit : units) {
      if (unit->state() != FlatUnit::State::kSharded) {
        unit->free_full();
      }
    }
  }
  for (auto& unit : units) {
    unit->reset_backward();
  }
  std::fill(training.begin(), training.end(), TrainingState::kIdle);
}

} // namespace ddp
