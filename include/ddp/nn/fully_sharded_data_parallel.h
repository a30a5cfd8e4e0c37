#pragma once

/// FullyShardedDataParallel: PyTorch's FSDP (ZeRO stage 3) for LibTorch.
/// Each rank keeps 1/N of every parameter; a unit (a layer, a block)
/// gathers its full parameters just before its forward, frees them after,
/// gathers them again for its backward and reduce-scatters its gradients,
/// so that a rank's peak holds about 1/N of the model plus a unit or two.
/// See docs/ddp.md, "Fully sharded data parallel".

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/ordered_dict.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ddp/checkpoint/state_dict.h>
#include <ddp/comm/process_group.h>
#include <ddp/nn/plain_module.h>

namespace ddp {

/// How FullyShardedDataParallel shards, PyTorch's `ShardingStrategy`.
enum class ShardingStrategy {
  /// Parameters, gradients and optimizer state sharded; a unit's parameters
  /// are freed after its forward and gathered again for its backward.
  kFullShard,
  /// As kFullShard, but a unit keeps its gathered parameters from its
  /// forward until its backward (ZeRO stage 2 memory, less traffic).
  kShardGradOp,
  /// Nothing sharded: every rank holds everything and gradients are
  /// all-reduced, as DistributedDataParallel.
  kNoShard,
  /// kFullShard within a node, replicated across nodes: gradients are
  /// reduce-scattered within the node, then all-reduced across nodes.
  kHybridShard,
};

/// The strategy's name as written here, e.g. "kFullShard".
const char* to_string(ShardingStrategy strategy);

/// Mixed precision: the dtype a unit's parameters are gathered in (and its
/// forward and backward compute in), and the dtype gradients are reduced
/// in. The shards the optimizer steps stay in the parameters' own dtype
/// (fp32 master weights). PyTorch's `MixedPrecision`.
/// Example: `ddp::MixedPrecision().param_dtype(at::kBFloat16)`
struct MixedPrecision {
  /// Default: nullopt (the parameters' own dtype).
  TORCH_ARG(c10::optional<at::ScalarType>, param_dtype) = c10::nullopt;
  /// Default: nullopt (param_dtype when set, else the parameters' dtype).
  TORCH_ARG(c10::optional<at::ScalarType>, reduce_dtype) = c10::nullopt;
};

/// Offloading to host memory (for training on GPUs), PyTorch's
/// `CPUOffload`. With `offload_params`, each rank's shards (the parameters
/// the optimizer steps), their gradients, and so the optimizer's state,
/// live in host memory (pinned), and the optimizer steps on the CPU; a
/// unit's shard is copied to its GPU for the all-gather (asynchronously,
/// from pinned memory, so that a prefetch overlaps compute), and each
/// reduced gradient shard is copied back. The model's own memory on the GPU
/// is then the gathered units and the activations only. For a model on the
/// CPU it changes nothing.
struct CPUOffload {
  /// Default: false, as PyTorch's.
  TORCH_ARG(bool, offload_params) = false;
};

/// Which submodules become units without being wrapped in a `ddp::FsdpUnit`
/// (PyTorch FSDP1's `auto_wrap_policy`): called for each candidate with its
/// path in the model ("body.1.0"), the module, and how many parameter
/// elements it holds; true makes it a unit. The candidates are the children
/// of every Sequential in the model, at any depth, outside explicit units
/// (a Sequential calls its children through itself, so FSDP can put a unit
/// around one; a submodule held as a member and called directly cannot be
/// intercepted: wrap it in a ddp::FsdpUnit), and, for a Sequential model,
/// its own children. They are visited bottom-up; a candidate that holds a
/// unit already (an explicit one, or one the policy chose below it) is not
/// one, since units do not nest: its other parameters join the root unit,
/// as do those of every candidate the policy leaves out. A chosen child of
/// a nested Sequential must take and return one tensor. See
/// `module_wrap_policy` and `size_based_auto_wrap_policy`.
using AutoWrapPolicy =
    std::function<bool(const std::string& path, const torch::nn::Module& module, int64_t numel)>;

/// A unit of every module of one of the types `ModuleImpls` (the Impl
/// classes: `ddp::module_wrap_policy<BlockImpl>()`), PyTorch's
/// `ModuleWrapPolicy`.
template <typename... ModuleImpls>
AutoWrapPolicy module_wrap_policy() {
  return [](const std::string&, const torch::nn::Module& module, int64_t) {
    return ((dynamic_cast<const ModuleImpls*>(&module) != nullptr) || ...);
  };
}

/// A unit of every candidate with at least `min_num_params` parameter
/// elements, PyTorch's `size_based_auto_wrap_policy` (whose default is 1e8).
AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params = 100000000);

/// Initialises `module`'s own parameters and buffers (not its children's),
/// drawing from the default CPU generator, which `seeded_init` has seeded
/// for it. `path` is the module's name in the model as state dicts name it
/// ("transformer.h.0.attn.c_proj"): an init may depend on it (GPT-2 scales
/// its residual projections).
using ModuleInit = std::function<void(torch::nn::Module& module, const std::string& path)>;

/// LibTorch's own initialisation, the distribution its constructors draw
/// from: `reset_parameters()` of Linear, Bilinear, Conv1d/2d/3d,
/// ConvTranspose1d/2d/3d, Embedding, EmbeddingBag, LayerNorm, GroupNorm,
/// BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d and PReLU (its weight to its
/// initial value). Throws c10::Error naming the module for a module of
/// another type that holds parameters: pass a ModuleInit for it.
void reset_parameters(torch::nn::Module& module, const std::string& path);

/// How `seeded_init` and deferred units initialise.
struct ParamInit {
  /// The model's seed. Default: 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Default: ddp::reset_parameters.
  TORCH_ARG(ModuleInit, init) = reset_parameters;
  /// Where a deferred unit's parameters go once built and initialised
  /// (they are initialised on the CPU whatever the device, so that the
  /// values do not depend on it). Default: the CPU.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
};

/// Options of FullyShardedDataParallel. PyTorch's defaults.
/// Example:
/// ```
/// ddp::FullyShardedDataParallel model(net, ddp::FullyShardedDataParallelOptions()
///     .sharding_strategy(ddp::ShardingStrategy::kShardGradOp)
///     .forward_prefetch(true));
/// ```
struct FullyShardedDataParallelOptions {
  /// The group parameters are sharded over (kHybridShard: the whole job, split
  /// as `shard_group`/`replicate_group` say). Default: nullptr, the default
  /// group of `ddp::init_process_group()`.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  /// Default: kFullShard.
  TORCH_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::kFullShard;
  /// Default: no mixed precision.
  TORCH_ARG(MixedPrecision, mixed_precision) = {};
  /// Default: nothing offloaded.
  TORCH_ARG(CPUOffload, cpu_offload) = {};
  /// Start gathering the next unit's parameters while the current unit's
  /// forward runs (memory of two gathered units). Default: false.
  TORCH_ARG(bool, forward_prefetch) = false;
  /// Start gathering the next unit's parameters for backward when the
  /// current unit's backward begins (PyTorch's BACKWARD_PRE). Default: true.
  TORCH_ARG(bool, backward_prefetch) = true;
  /// Broadcast rank 0's parameters and buffers at construction, so that
  /// ranks may start from different values (PyTorch FSDP's
  /// sync_module_states). Default: false: each rank's shard is taken from
  /// its own copy, and construction checks (a checksum of each tensor,
  /// compared across ranks) that the copies are equal, refusing, with the
  /// first tensor that differs, a model that would train a mix of them.
  TORCH_ARG(bool, sync_module_states) = false;
  /// kHybridShard only: the group within a node (parameters sharded over it)
  /// and the group across nodes (this rank's peers of the same position in
  /// the other nodes). Default: both nullptr, made from the default group
  /// with nodes of the launcher's local world size (LOCAL_WORLD_SIZE, or
  /// Slurm's or Open MPI's) of consecutive ranks (a collective; every rank
  /// must build the model at the same point).
  TORCH_ARG(std::shared_ptr<ProcessGroup>, shard_group) = nullptr;
  /// See shard_group. Default: nullptr.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, replicate_group) = nullptr;
  /// Units chosen by a policy, besides the explicit ones; see
  /// AutoWrapPolicy. Default: none (a Sequential's children are its units; a
  /// custom module's units are its FsdpUnits).
  TORCH_ARG(AutoWrapPolicy, auto_wrap_policy) = nullptr;
  /// Initialise the model with ddp::seeded_init at construction, and build
  /// its deferred units (ddp::deferred_unit) one at a time, keeping only
  /// this rank's shards (include <ddp/nn/deferred_init.h>). Default: none:
  /// the values the model holds, and no deferred unit.
  TORCH_ARG(c10::optional<ParamInit>, param_init) = c10::nullopt;
};

/// Options of `full_state_dict()`, PyTorch's FullStateDictConfig.
/// Example: `model->full_state_dict(ddp::FullStateDictOptions().rank0_only(true).offload_to_cpu(true))`,
/// what a checkpoint written by rank 0 wants.
struct FullStateDictOptions {
  /// Only rank 0 of the group gets the tensors (the others an empty dict).
  /// Default: false, as PyTorch 2.11's FullStateDictConfig().
  TORCH_ARG(bool, rank0_only) = false;
  /// Copy the tensors to the CPU. Default: false, as PyTorch 2.11's.
  TORCH_ARG(bool, offload_to_cpu) = false;
};

namespace detail {
class FsdpUnitState;
struct FsdpAccess;
} // namespace detail

/// A unit of a custom module under FullyShardedDataParallel: wrap a
/// submodule where it is registered, and call it as before.
/// ```
/// struct NetImpl : torch::nn::Module {
///   NetImpl() : block(register_module("block", ddp::FsdpUnit(Block()))) {}
///   torch::Tensor forward(torch::Tensor x) { return block(x); }
///   ddp::FsdpUnit block;
/// };
/// ```
/// Without FullyShardedDataParallel it only forwards the call, so the same
/// model runs in one process. LibTorch names its parameters under the
/// submodule's name "module" (`named_parameters()` gives
/// "block.module.weight"); every state dict and checkpoint leaves that level
/// out ("block.weight"), as PyTorch leaves out its wrappers', so that the
/// state loads into the model without FsdpUnits, in C++ or Python. Under
/// FullyShardedDataParallel, it gathers the submodule's parameters around
/// its forward, and throws c10::Error when called outside the wrapping
/// model's forward. Units must not nest.
///
/// Thread-safety: as FullyShardedDataParallelImpl, whose forward calls it.
class FsdpUnitImpl : public torch::nn::Module {
 public:
  template <typename ModuleType>
  explicit FsdpUnitImpl(const torch::nn::ModuleHolder<ModuleType>& module)
      : any_(module), module_(register_module("module", module.ptr())) {}

  /// Calls the submodule's forward with `args`; `ReturnType` is what it
  /// returns (a tensor, a std::vector or std::tuple of tensors, ...).
  template <typename ReturnType = torch::Tensor, typename... Args>
  ReturnType forward(Args&&... args) {
    if (!module_) {
      fail_not_built();
    }
    if (!state_) {
      return any_.template forward<ReturnType>(std::forward<Args>(args)...);
    }
    pre_forward();
    ReturnType output = any_.template forward<ReturnType>(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    collect_tensors(output, tensors);
    post_forward(tensors);
    return output;
  }

  /// The wrapped submodule (nullptr while a deferred unit is not built).
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  /// A unit whose submodule `factory` builds later (ddp::deferred_unit).
  struct Deferred {
    std::function<torch::nn::AnyModule()> factory;
  };
  explicit FsdpUnitImpl(Deferred deferred) : factory_(std::move(deferred.factory)) {}

  /// Builds a deferred unit's submodule (its parameters as its
  /// constructor makes them) and registers it; nothing for a built unit.
  /// ddp::materialize and FullyShardedDataParallel call it.
  void build();
  bool built() const { return module_ != nullptr; }

 protected:
  /// Wraps what `module` holds (auto-wrapped units).
  explicit FsdpUnitImpl(torch::nn::AnyModule module)
      : any_(std::move(module)), module_(register_module("module", any_.ptr())) {}

 private:
  friend class FullyShardedDataParallelImpl;
  void pre_forward();
  void post_forward(std::vector<at::Tensor>& outputs);
  static void collect_tensors(const at::Tensor& output, std::vector<at::Tensor>& into) {
    into.push_back(output);
  }
  static void collect_tensors(const std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& into) {
    into.insert(into.end(), outputs.begin(), outputs.end());
  }
  template <typename... Ts>
  static void collect_tensors(const std::tuple<Ts...>& outputs, std::vector<at::Tensor>& into) {
    std::apply([&](const auto&... items) { (collect_tensors(items, into), ...); }, outputs);
  }
  template <typename T>
  static void collect_tensors(const T&, std::vector<at::Tensor>&) {}

  [[noreturn]] static void fail_not_built();

  torch::nn::AnyModule any_;
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::nn::AnyModule()> factory_; // deferred units, until built
  // Set by the FullyShardedDataParallel that wraps the model holding this
  // unit; it outlives the call (the model's forward runs inside it).
  std::shared_ptr<detail::FsdpUnitState> state_;
};

/// See FsdpUnitImpl.
class FsdpUnit : public torch::nn::ModuleHolder<FsdpUnitImpl> {
 public:
  using torch::nn::ModuleHolder<FsdpUnitImpl>::ModuleHolder;

  template <typename... Args>
  torch::Tensor operator()(Args&&... args) {
    return get()->template forward<torch::Tensor>(std::forward<Args>(args)...);
  }
};

/// RAII guard of `no_sync()`: while it lives, backward accumulates full
/// (unsharded) gradients on every rank without communicating; the first
/// backward after it reduce-scatters the sum. Move-only.
///
/// Thread-safety: use it on the thread that trains the model.
class FsdpNoSyncGuard {
 public:
  FsdpNoSyncGuard(FsdpNoSyncGuard&& other) noexcept;
  FsdpNoSyncGuard& operator=(FsdpNoSyncGuard&&) = delete;
  FsdpNoSyncGuard(const FsdpNoSyncGuard&) = delete;
  FsdpNoSyncGuard& operator=(const FsdpNoSyncGuard&) = delete;
  ~FsdpNoSyncGuard();

 private:
  friend class FullyShardedDataParallelImpl;
  explicit FsdpNoSyncGuard(std::shared_ptr<bool> flag);
  std::shared_ptr<bool> flag_;
};

/// The module behind `FullyShardedDataParallel`; see that class.
///
/// Construction is a collective: every rank checks that all ranks wrap the
/// same units (names, shapes, dtypes), then keeps its shard of each. The
/// wrapped module's parameters then hold no storage outside its forward and
/// backward; read them through `full_state_dict()`.
///
/// Thread-safety: not thread-safe; run forward and backward from one thread.
class FullyShardedDataParallelImpl : public torch::nn::Module {
 public:
  /// Wraps a Sequential: each child that has parameters is a unit.
  explicit FullyShardedDataParallelImpl(const torch::nn::Sequential& module,
                                        const FullyShardedDataParallelOptions& options = {});

  /// Wraps a custom module: each `ddp::FsdpUnit` in it is a unit, and the
  /// parameters outside every unit form the root unit, gathered for the
  /// whole forward and backward. `ModuleType`'s forward must not be a
  /// template (as for torch::nn::AnyModule).
  template <typename ModuleType>
  explicit FullyShardedDataParallelImpl(const torch::nn::ModuleHolder<ModuleType>& module,
                                        const FullyShardedDataParallelOptions& options = {})
      : FullyShardedDataParallelImpl(torch::nn::AnyModule(module), nullptr, module.ptr(), options) {}

  /// Wraps a module that no ModuleHolder holds (`auto net =
  /// std::make_shared<Net>()`, `struct Net : torch::nn::Module`), as above.
  template <typename ModuleType,
            typename = std::enable_if_t<detail::is_plain_module_v<ModuleType, FullyShardedDataParallelImpl> &&
                                        !std::is_same_v<ModuleType, torch::nn::SequentialImpl>>>
  explicit FullyShardedDataParallelImpl(std::shared_ptr<ModuleType> module,
                                        const FullyShardedDataParallelOptions& options = {})
      : FullyShardedDataParallelImpl(torch::nn::ModuleHolder<ModuleType>(std::move(module)), options) {}

  /// Wraps a module held by value (`Net net;`), as above, without owning
  /// it: it must outlive the wrapper (one made by std::make_shared is shared
  /// instead).
  template <typename ModuleType,
            typename = std::enable_if_t<detail::is_plain_module_v<ModuleType, FullyShardedDataParallelImpl> &&
                                        !std::is_same_v<ModuleType, torch::nn::SequentialImpl>>>
  explicit FullyShardedDataParallelImpl(ModuleType& module, const FullyShardedDataParallelOptions& options = {})
      : FullyShardedDataParallelImpl(detail::hold(module), options) {}

  /// A Sequential without its holder (`std::make_shared<torch::nn::SequentialImpl>(...)`).
  explicit FullyShardedDataParallelImpl(std::shared_ptr<torch::nn::SequentialImpl> module,
                                        const FullyShardedDataParallelOptions& options = {})
      : FullyShardedDataParallelImpl(torch::nn::Sequential(std::move(module)), options) {}

  ~FullyShardedDataParallelImpl() override;

  /// Runs the wrapped module's forward with `args`, as `net(args...)`.
  template <typename ReturnType = torch::Tensor, typename... Args>
  ReturnType forward(Args&&... args) {
    begin_forward();
    struct End {
      FullyShardedDataParallelImpl* self;
      ~End() { self->end_forward(); }
    } end{this};
    if (sequential_) {
      return forward_sequential<ReturnType>(cast_input(std::forward<Args>(args))...);
    }
    ReturnType output = any_.template forward<ReturnType>(cast_input(std::forward<Args>(args))...);
    std::vector<at::Tensor> tensors;
    FsdpUnitImpl::collect_tensors(output, tensors);
    root_post_forward(tensors);
    return output;
  }

  /// Gradient accumulation without communication; see FsdpNoSyncGuard.
  FsdpNoSyncGuard no_sync();

  /// The full parameters and buffers, named as `module_state_dict` names
  /// the wrapped module's (PyTorch's names: no FsdpUnit level); a plain
  /// module loads them with `load_module_state_dict`. A collective.
  torch::OrderedDict<std::string, at::Tensor> full_state_dict(const FullStateDictOptions& options = {});

  /// Loads a full state (of `full_state_dict()`, or a plain module's
  /// parameters and buffers by name) into this rank's shards and buffers.
  /// Every rank passes the whole state. Not a collective. Throws c10::Error
  /// naming what is missing, unexpected, or of the wrong shape, before
  /// changing anything. Names with a FsdpUnit's "module" level, as earlier
  /// ddp versions saved them, still load (with a warning).
  void load_full_state_dict(const torch::OrderedDict<std::string, at::Tensor>& state);

  /// Clips the gradients of this rank's shards so that the norm of the whole
  /// model's gradient is at most `max_norm`; returns that norm (before
  /// clipping), the same on every rank. `norm_type` 2 by default; INFINITY
  /// for the largest absolute value. A collective.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  /// The wrapped module.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  /// The group parameters are sharded over (kNoShard: a group of this rank
  /// alone in effect) and the one gradients are all-reduced over after the
  /// reduce-scatter (nullptr for kFullShard and kShardGradOp).
  const std::shared_ptr<ProcessGroup>& shard_group() const;
  const std::shared_ptr<ProcessGroup>& replicate_group() const;

  /// How many units there are (the root unit included when it holds
  /// parameters), and unit i's parameter names, in the wrapped module.
  size_t num_units() const;
  std::vector<std::string> unit_parameter_names(size_t unit) const;
  /// Unit i's label: "child 3" (a Sequential model's child), the path of
  /// an FsdpUnit or of a submodule the auto-wrap policy chose ("body.1.0"),
  /// or "(root)".
  std::string unit_label(size_t unit) const;

  /// Propagates train/eval to the wrapped module.
  void train(bool on = true) override;

  struct State;

 private:
  friend struct detail::FsdpAccess; // the sharded checkpoints' way in
  FullyShardedDataParallelImpl(torch::nn::AnyModule any, std::shared_ptr<torch::nn::SequentialImpl> sequential,
                               std::shared_ptr<torch::nn::Module> module,
                               const FullyShardedDataParallelOptions& options);

  template <typename ReturnType, typename First, typename... Rest>
  ReturnType forward_sequential(First&& first, Rest&&... rest) {
    torch::nn::AnyValue value(0);
    size_t index = 0;
    for (auto& child : *sequential_) {
      sequential_pre_forward(index);
      if (index == 0) {
        value = child.any_forward(std::forward<First>(first), std::forward<Rest>(rest)...);
      } else {
        value = child.any_forward(std::move(value));
      }
      sequential_post_forward(index, value);
      ++index;
    }
    return value.template get<ReturnType>();
  }

  // Mixed precision: floating-point tensor arguments are cast to the
  // parameters' compute dtype, as PyTorch's root FSDP does.
  template <typename T>
  decltype(auto) cast_input(T&& value) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      return cast_tensor(value);
    } else {
      return std::forward<T>(value);
    }
  }
  at::Tensor cast_tensor(const at::Tensor& value) const;

  void begin_forward();
  void end_forward() noexcept;
  void root_post_forward(std::vector<at::Tensor>& outputs);
  void sequential_pre_forward(size_t child);
  void sequential_post_forward(size_t child, torch::nn::AnyValue& output);

  torch::nn::AnyModule any_;
  std::shared_ptr<torch::nn::SequentialImpl> sequential_;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<State> state_;
};

/// FullyShardedDataParallel: `ddp::FullyShardedDataParallel model(net);`
/// then `model(x)`, and an optimizer over `model->parameters()` (this
/// rank's shards: one flat tensor per unit).
class FullyShardedDataParallel : public torch::nn::ModuleHolder<FullyShardedDataParallelImpl> {
 public:
  using torch::nn::ModuleHolder<FullyShardedDataParallelImpl>::ModuleHolder;

  template <typename... Args>
  torch::Tensor operator()(Args&&... args) {
    return get()->template forward<torch::Tensor>(std::forward<Args>(args)...);
  }

  template <typename ReturnType, typename... Args>
  ReturnType forward(Args&&... args) {
    return get()->template forward<ReturnType>(std::forward<Args>(args)...);
  }
};

/// The optimizer's state over `model`'s shards as the full optimizer state
/// dict of the unwrapped model (PyTorch's FSDP.optim_state_dict with a
/// full state dict): each parameter's state joined from every rank's shard,
/// parameters numbered as a plain optimizer over the unwrapped model's
/// parameters numbers them, their names in `param_names`. For LibTorch's
/// Adam, AdamW, SGD, RMSprop and Adagrad. A collective (of the shard group).
OptimizerStateDict full_optimizer_state_dict(FullyShardedDataParallel& model, const torch::optim::Optimizer& optimizer,
                                             const FullStateDictOptions& options = {});

/// Loads a full optimizer state dict (of full_optimizer_state_dict, or of a
/// plain optimizer over the unwrapped model, from C++ or Python) into the
/// state of this rank's shards, and the groups' options. Every rank passes
/// the whole state. Not a collective. Throws c10::Error naming the problem
/// before changing anything.
void load_full_optimizer_state_dict(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                                    const OptimizerStateDict& state);

/// Copies a full state (of `full_state_dict()`) into a plain, unwrapped
/// module's parameters and buffers by name. Throws c10::Error naming what
/// is missing, unexpected or of the wrong shape, before changing anything.
void load_full_state_dict(torch::nn::Module& module, const torch::OrderedDict<std::string, at::Tensor>& state);

/// A plain module's parameters and buffers by name, as a full state that
/// `load_full_state_dict` takes.
torch::OrderedDict<std::string, at::Tensor> full_state_dict_of(const torch::nn::Module& module);

} // namespace ddp
