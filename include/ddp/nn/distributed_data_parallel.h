#pragma once

/// DistributedDataParallel: wraps a module so that every rank ends each
/// training step with the same parameters, reducing gradients in buckets
/// while backward is still running.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <type_traits>
#include <string>
#include <tuple>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/nn/plain_module.h>
#include <ddp/comm_hooks/comm_hooks.h>
#include <ddp/nn/insight.h>

namespace ddp {

namespace internal {
class Reducer;
} // namespace internal

class Join;

namespace detail {
// How DistributedDataParallel calls the wrapped module's forward: through
// an AnyModule for modules with one non-template forward, directly for
// Sequential, whose forward is a template that AnyModule cannot hold.
struct Forwarder {
  torch::nn::AnyModule any;
  std::shared_ptr<torch::nn::SequentialImpl> sequential;
};

template <typename ModuleType>
Forwarder make_forwarder(const torch::nn::ModuleHolder<ModuleType>& module) {
  return {torch::nn::AnyModule(module), nullptr};
}

inline Forwarder make_forwarder(const torch::nn::ModuleHolder<torch::nn::SequentialImpl>& module) {
  return {torch::nn::AnyModule(), module.ptr()};
}

} // namespace detail

/// Options of DistributedDataParallel. PyTorch's defaults.
/// Example:
/// ```
/// ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions()
///                                             .bucket_cap_mb(50)
///                                             .find_unused_parameters(true));
/// ```
struct DistributedDataParallelOptions {
  /// The group to reduce over: a subgroup from `ddp::new_group` makes an
  /// independent replica group of its members (gradients averaged over them,
  /// the initial state broadcast from its rank 0, i.e. global rank
  /// sorted(ranks)[0]); it must not be a non-member's handle. Default:
  /// nullptr, meaning the default group of `ddp::init_process_group()`.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  /// Capacity of a gradient bucket in MiB. Default: 25.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Capacity of the first bucket in MiB: the last layers' gradients, ready
  /// first, so a small bucket starts communication early. Default: 1.
  TORCH_ARG(double, first_bucket_cap_mb) = 1.0;
  /// Broadcast rank 0's buffers (e.g. BatchNorm running statistics) before
  /// every forward that follows a synchronised one (gradients enabled, not
  /// under `no_sync()`); under `ddp::Join`, the buffers of the highest rank
  /// still training. Default: true.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Tolerate parameters that get no gradient in a backward: after every
  /// forward, those that the output does not depend on count as ready, and
  /// the output's tensors pass through one autograd node, so that the
  /// parameters behind an output that the loss does not use count as unused
  /// too. A parameter unused on every rank keeps its gradient as it was.
  /// Costs a walk of the autograd graph. Default: false.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Make each parameter's `grad()` a view into its bucket: no copy back after
  /// the allreduce, and less memory. Default: false.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// Promise that every iteration's graph is the first synchronised one's:
  /// the same parameters get gradients, each from as many gradient hooks
  /// (a layer run twice under activation checkpointing fires its hook twice).
  /// The first iteration reduces once backward has ended, recording the
  /// counts, the unused parameters and the order gradients became ready;
  /// later ones reduce each parameter after its recorded count, mark the
  /// unused ones ready without a graph walk, and use buckets rebuilt in the
  /// recorded order. A graph that changes is an error. Overrides
  /// find_unused_parameters. Default: false.
  TORCH_ARG(bool, static_graph) = false;
  /// The devices of this process's replica, as in PyTorch: empty, or exactly
  /// one device, which must be the device of every parameter. Default: {}.
  TORCH_ARG(std::vector<c10::Device>, device_ids) = {};
  /// Agree on the model across ranks and broadcast rank 0's parameters and
  /// buffers at construction, as PyTorch's `init_sync`. false skips both:
  /// every rank must then start from the same values itself (a model
  /// loaded from one checkpoint everywhere). Default: true.
  TORCH_ARG(bool, init_sync) = true;
  /// Parameters and buffers that DDP leaves alone, by their names in the
  /// module (as `named_parameters()` and `named_buffers()` give them:
  /// "0.weight"), as PyTorch's
  /// `DistributedDataParallel._set_params_and_buffers_to_ignore_for_model`:
  /// their gradients are not reduced (each rank keeps its own), and they
  /// are neither compared across ranks nor broadcast, at construction or
  /// before a forward. A name that is no parameter or buffer of the module
  /// is an error naming it. Default: {}.
  TORCH_ARG(std::vector<std::string>, params_and_buffers_to_ignore) = {};
};

/// RAII guard of `no_sync()`: while it lives, backward accumulates gradients
/// locally; the first synchronised backward after it reduces the sum.
///
/// Thread-safety: use it on the thread that trains the model.
class NoSyncGuard {
 public:
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  friend class DistributedDataParallelImpl;
  explicit NoSyncGuard(internal::Reducer* reducer);
  // Non-owning: the DistributedDataParallel that made the guard outlives it.
  internal::Reducer* reducer_;
  bool previous_;
};

/// The module behind `DistributedDataParallel`; see that class.
///
/// Construction is a synchronisation point: every rank checks that all ranks
/// hold the same parameters (names, order, shapes, dtypes), then rank 0's
/// parameters and buffers are broadcast to all. Forward (buffers) and
/// backward (gradients) are synchronisation points too: every rank must run
/// them the same number of times (see `ddp::Join` for uneven inputs).
///
/// Thread-safety: not thread-safe; use it from one thread, like a module.
/// Its gradient hooks run on the autograd engine's thread during backward.
class DistributedDataParallelImpl : public torch::nn::Module {
 public:
  /// Wraps `module` (any module holder: `torch::nn::Sequential`, a
  /// `TORCH_MODULE`, ...). Move the module to its device first.
  template <typename ModuleType>
  explicit DistributedDataParallelImpl(torch::nn::ModuleHolder<ModuleType> module,
                                       DistributedDataParallelOptions options = {})
      : DistributedDataParallelImpl(detail::make_forwarder(module), module.ptr(),
                                    std::move(options)) {}

  /// Wraps a module that no ModuleHolder holds, as PyTorch's C++ examples
  /// write them: `auto net = std::make_shared<Net>();` with
  /// `struct Net : torch::nn::Module` (its forward must not be a template).
  template <typename ModuleType,
            typename = std::enable_if_t<detail::is_plain_module_v<ModuleType, DistributedDataParallelImpl>>>
  explicit DistributedDataParallelImpl(std::shared_ptr<ModuleType> module, DistributedDataParallelOptions options = {})
      : DistributedDataParallelImpl(torch::nn::ModuleHolder<ModuleType>(std::move(module)), std::move(options)) {}

  /// Wraps a module held by value (`Net net;`), which this wrapper does not
  /// own: it must outlive the wrapper (one made by std::make_shared is
  /// shared instead).
  template <typename ModuleType,
            typename = std::enable_if_t<detail::is_plain_module_v<ModuleType, DistributedDataParallelImpl>>>
  explicit DistributedDataParallelImpl(ModuleType& module, DistributedDataParallelOptions options = {})
      : DistributedDataParallelImpl(detail::hold(module), std::move(options)) {}

  /// Wraps `module`, called through `forwarder`.
  DistributedDataParallelImpl(detail::Forwarder forwarder,
                              std::shared_ptr<torch::nn::Module> module,
                              DistributedDataParallelOptions options);
  ~DistributedDataParallelImpl() override;

  /// Runs the wrapped module's forward with `args`, as `net(args...)` would.
  /// `ReturnType` is what that forward returns (default: a tensor).
  template <typename ReturnType = torch::Tensor, typename... Args>
  ReturnType forward(Args&&... args) {
    pre_forward();
    ReturnType output =
        forwarder_.sequential
            ? forwarder_.sequential->template forward<ReturnType>(std::forward<Args>(args)...)
            : forwarder_.any.template forward<ReturnType>(std::forward<Args>(args)...);
    // Non-owning: the tensors of `output`, which outlives the call.
    std::vector<at::Tensor*> tensors;
    for_each_output_tensor(output, [&](at::Tensor& tensor) { tensors.push_back(&tensor); });
    post_forward(tensors);
    return output;
  }

  /// The wrapped module. Use it for single-rank work such as evaluation on
  /// rank 0 only: calling the wrapper would wait for the other ranks.
  std::shared_ptr<torch::nn::Module> module() const {
    return module_;
  }

  /// The wrapped module as its concrete type, e.g.
  /// `model->module_as<torch::nn::SequentialImpl>()`.
  template <typename ModuleType>
  std::shared_ptr<ModuleType> module_as() const {
    return std::dynamic_pointer_cast<ModuleType>(module_);
  }

  /// The device of the replica's parameters (CPU when it has none). Small
  /// control tensors go there too, since NCCL moves device tensors only.
  c10::Device device() const;

  /// The group gradients are reduced over.
  const std::shared_ptr<ProcessGroup>& process_group() const;

  /// Returns a guard under which backward passes accumulate gradients
  /// locally without communication (gradient accumulation).
  /// Example: `{ auto guard = model->no_sync(); model(x1).sum().backward(); }`
  NoSyncGuard no_sync();

  /// Replaces the communication hook (default: comm_hooks::allreduce()).
  /// Call before the first backward. A hook made with
  /// `comm_hooks::with_state` (PowerSGD's, post-local SGD's) brings its
  /// state, which `save_checkpoint` and `load_checkpoint` then carry: register
  /// it before loading a checkpoint.
  void register_comm_hook(CommHook hook);

  /// The registered hook's state (see register_comm_hook), or nullptr.
  std::shared_ptr<CommHookState> comm_hook_state() const;

  /// Called once per gradient bucket of every synchronised backward, after
  /// the bucket's reduced gradients are in its parameters' `.grad`: in
  /// bucket order on every rank, on the autograd engine thread, during
  /// backward when no usage map must be reduced first (see docs/ddp.md,
  /// "Sharded optimizer state"). It may issue collectives: every rank
  /// issues them at the same point. `gradient_owner`, when given, names per
  /// parameter the one rank that keeps its reduced gradient (-1: every
  /// rank): every `.grad` is dropped once copied into its bucket, and only
  /// the owner gets the reduced gradient back (the others' stay
  /// undefined). Each bucket then lays its gradients out
  /// grouped by owner, in rank order, so that a communication hook can
  /// reduce-scatter it in place, and holds memory only from its first
  /// gradient to its write-back. ZeroRedundancyOptimizer's `overlap_with`
  /// uses them (stage 2). Call between iterations; not under Join.
  using BucketReducedHook =
      std::function<void(size_t bucket_index, const std::vector<at::Tensor>& parameters)>;
  void register_bucket_reduced_hook(BucketReducedHook hook,
                                    std::function<int(const at::Tensor&)> gradient_owner = nullptr);

  /// Figures of the last synchronised iteration.
  IterationInsight last_iteration_insight() const;

  /// The current bucket layout (parameter names per bucket, in launch order).
  std::vector<BucketInsight> bucket_layout() const;

  /// Checks that every rank holds the same parameters right now (values, not
  /// only shapes): a collective that returns the largest absolute difference
  /// from rank 0 over all parameters (but those of
  /// params_and_buffers_to_ignore), 0 when they agree. A debugging aid.
  double max_parameter_difference_across_ranks();

 private:
  friend class Join;

  // What the wrapper keeps besides the module; defined in the library.
  struct State;

  void pre_forward();
  // May replace the output's tensors (with find_unused_parameters or
  // static_graph, by copies that one autograd node makes).
  void post_forward(const std::vector<at::Tensor*>& outputs);

  // Calls `fn(at::Tensor&)` on each tensor of a forward's output: a tensor,
  // a std::vector of tensors, or a std::tuple of those. Other types hold no
  // tensor DDP can see (find_unused_parameters then says so).
  template <typename Fn>
  static void for_each_output_tensor(at::Tensor& output, const Fn& fn) {
    fn(output);
  }
  template <typename Fn>
  static void for_each_output_tensor(std::vector<at::Tensor>& outputs, const Fn& fn) {
    for (auto& output : outputs) {
      fn(output);
    }
  }
  template <typename Fn, typename... Ts>
  static void for_each_output_tensor(std::tuple<Ts...>& outputs, const Fn& fn) {
    std::apply([&](auto&... items) { (for_each_output_tensor(items, fn), ...); }, outputs);
  }
  template <typename T, typename Fn>
  static void for_each_output_tensor(T&, const Fn&) {}

  // Read by the inline and template members above, hence here.
  detail::Forwarder forwarder_;
  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<State> state_;
};

/// DistributedDataParallel: `ddp::DistributedDataParallel model(net);` then
/// use `model` like `net`: `model(x)`, `model->parameters()`.
///
/// A module holder like the ones TORCH_MODULE makes, with a call operator
/// that forwards any arguments: the wrapped module's forward decides which
/// it takes. `model(x)` returns a tensor; for another return type write
/// `model.forward<ReturnType>(x)`.
class DistributedDataParallel : public torch::nn::ModuleHolder<DistributedDataParallelImpl> {
 public:
  using torch::nn::ModuleHolder<DistributedDataParallelImpl>::ModuleHolder;

  /// Runs forward on the wrapped module; see DistributedDataParallelImpl.
  template <typename... Args>
  torch::Tensor operator()(Args&&... args) {
    return get()->template forward<torch::Tensor>(std::forward<Args>(args)...);
  }

  /// Runs forward when the wrapped module returns something else than a
  /// tensor, e.g. `model.forward<std::tuple<at::Tensor, at::Tensor>>(x)`.
  template <typename ReturnType, typename... Args>
  ReturnType forward(Args&&... args) {
    return get()->template forward<ReturnType>(std::forward<Args>(args)...);
  }
};

} // namespace ddp
