// DistributedDataParallel: construction (the cross-rank model check and the
// broadcast of rank 0's state), the work around the wrapped module's forward,
// and the debugging aids. The gradient machinery is the Reducer's
// (src/reducer/reducer.cpp).
//
// Note [Outputs through one node]: with find_unused_parameters, the tensors
// of a forward's output are replaced by copies made by one autograd node,
// OutputSink (PyTorch's _DDPSink). A backward from a loss that uses any of
// them then reaches every part of the output: the outputs the loss does not
// use get an undefined gradient, which autograd carries down to their
// parameters' gradient accumulators, so that their hooks still run. The
// Reducer counts such a parameter as ready but not used (its gradient
// stays undefined), instead of waiting for it until the next forward
// reports an unfinished reduction. Being reachable from some output (the
// graph walk) is not the same as taking part in this backward. With
// static_graph, the outputs of the first synchronised iteration only pass
// through it, as in PyTorch, and its backward queues the Reducer's delayed
// reduction (Note [Delayed reduction] in src/reducer/static_graph.cpp).

#include <ddp/nn/distributed_data_parallel.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/embedding.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include <ddp/blas.h>
#include <ddp/init.h>
#include <ddp/nn/join.h>

#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"
#include "nn/ddp_state.h"
#include "comm/collective_label.h"
#include "comm/objects/same_on_every_rank.h"
#include "nn/state_sync.h"
#include "nn/sync_batch_norm_internal.h"
#include "plan/plan_recorder.h"
#include "reducer/reducer.h"
#include "timeline/timeline.h"

namespace ddp {

namespace {

std::string who(const ProcessGroup& group) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] DistributedDataParallel");
}

// Nothing fails with the netlib reference BLAS, training is just 3-4x slower
// on the CPU, so a user may never find out why: say it once per process, on
// rank 0, with the fix. A model on a GPU does not compute with it.
void warn_if_reference_blas(const std::string& prefix) {
  static std::once_flag once;
  std::call_once(once, [&] {
    const BlasInfo& blas = blas_in_use();
    if (blas.is_reference) {
      internal::log_warning(c10::str(
          prefix, ": LibTorch computes with the reference BLAS (", blas.library,
          "), 3-4x slower on the CPU than an optimized one. On Debian or Ubuntu: "
          "apt-get install libopenblas0-openmp (scripts/setup.sh installs it); nothing needs "
          "rebuilding. See ddp::blas_in_use() in <ddp/blas.h>."));
    }
  });
}

// What every rank must agree on about one parameter: "'0.weight' with shape
// [16, 8] and dtype Float".
std::string describe_parameter(const std::string& name, const at::Tensor& tensor, bool sparse_gradient) {
  return c10::str("'", name, "' with shape ", tensor.sizes(), " and dtype ", tensor.scalar_type(),
                  sparse_gradient ? " and a sparse gradient" : "");
}

// The weights whose gradients are sparse: those of the Embedding and
// EmbeddingBag modules constructed with sparse(true), the modules PyTorch's
// DistributedDataParallel looks for too (Note [Sparse gradients] in
// src/reducer/reducer.cpp).
std::unordered_set<const void*> sparse_gradient_weights(torch::nn::Module& module) {
  std::unordered_set<const void*> weights;
  // The module itself apart: modules(include_self) needs it to be owned by a
  // shared_ptr, and a module held by value (`Net net;`) is not.
  std::vector<const torch::nn::Module*> all{&module};
  for (const auto& m : module.modules(/*include_self=*/false)) {
    all.push_back(m.get());
  }
  for (const torch::nn::Module* m : all) {
    if (const auto* embedding = dynamic_cast<const torch::nn::EmbeddingImpl*>(m)) {
      if (embedding->options.sparse()) {
        weights.insert(embedding->weight.unsafeGetTensorImpl());
      }
    } else if (const auto* bag = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(m)) {
      if (bag->options.sparse()) {
        weights.insert(bag->weight.unsafeGetTensorImpl());
      }
    }
  }
  return weights;
}

// Every rank's parameter list is rank 0's, or every rank raises the same
// error naming the first difference.
// options.params_and_buffers_to_ignore as a set, each name checked to be a
// parameter or buffer of `module`.
std::unordered_set<std::string> checked_ignored_names(const torch::nn::Module& module,
                                                      const DistributedDataParallelOptions& options,
                                                      const std::string& prefix) {
  std::unordered_set<std::string> ignored(options.params_and_buffers_to_ignore().begin(),
                                          options.params_and_buffers_to_ignore().end());
  if (ignored.empty()) {
    return ignored;
  }
  std::unordered_set<std::string> known;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    known.insert(item.key());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    known.insert(item.key());
  }
  for (const auto& name : options.params_and_buffers_to_ignore()) {
    DDP_CHECK(known.count(name) > 0, prefix, ": params_and_buffers_to_ignore names '", name,
              "', which is no parameter or buffer of the module; expected names as named_parameters() "
              "and named_buffers() give them (\"0.weight\")");
  }
  return ignored;
}

void verify_same_parameters(ProcessGroup& group, const std::vector<std::string>& names,
                            const std::vector<at::Tensor>& tensors,
                            const std::vector<bool>& sparse_gradients, c10::Device device) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < names.size(); ++i) {
    lines.push_back(describe_parameter(names[i], tensors[i], sparse_gradients[i]));
  }
  internal::check_same_on_every_rank(group, lines, device,
                                     {who(group), "the model differs across ranks", "parameter",
                                      "Every rank must wrap the same model: same parameters, in the same "
                                      "order, with the same shapes and dtypes."});
}

size_t mebibytes_to_bytes(double mb) {
  return static_cast<size_t>(mb * 1024.0 * 1024.0);
}

// The Reducer whose delayed reduction an OutputSink queues, held weakly (as
// PyTorch's _DDPSink holds its module) so that a graph outliving the
// DistributedDataParallel does not keep it alive. A capsule: the only way
// an AutogradContext keeps a C++ object.
struct DelayedReductionTarget : torch::CustomClassHolder {
  explicit DelayedReductionTarget(std::weak_ptr<internal::Reducer> reducer)
      : reducer(std::move(reducer)) {}
  std::weak_ptr<internal::Reducer> reducer;
};

constexpr const char* kDelayedReductionKey = "delayed_reduction";

// See Note [Outputs through one node]. Copies, as PyTorch's does: an output
// that aliased its input would be a view made by a custom function, which
// autograd forbids modifying in place.
struct OutputSink : torch::autograd::Function<OutputSink> {
  // `outputs` as a TensorList: the custom Function machinery takes a
  // std::vector argument for a non-tensor, and would not track it.
  // `delayed`: the Reducer to start the delayed reduction of in backward,
  // or empty.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* context,
                                                at::TensorList outputs,
                                                std::weak_ptr<internal::Reducer> delayed) {
    context->set_materialize_grads(false); // an unused output's gradient stays undefined
    if (!delayed.expired()) {
      context->saved_data[kDelayedReductionKey] =
          c10::IValue::make_capsule(c10::make_intrusive<DelayedReductionTarget>(delayed));
    }
    torch::autograd::variable_list copies;
    copies.reserve(outputs.size());
    for (const auto& output : outputs) {
      copies.push_back(output.clone());
    }
    return copies;
  }

  // Runs on the autograd engine thread, in the outermost backward, before
  // any gradient accumulator of the forward it ends.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list gradients) {
    const auto found = context->saved_data.find(kDelayedReductionKey);
    if (found != context->saved_data.end()) {
      const auto target = c10::static_intrusive_pointer_cast<DelayedReductionTarget>(
          found->second.toCapsule());
      if (auto reducer = target->reducer.lock()) {
        reducer->queue_delayed_reduction();
      }
    }
    gradients.emplace_back(); // for `delayed`, not a tensor
    return gradients;
  }
};

} // namespace

// ---- NoSyncGuard ---------------------------------------------------------------------

NoSyncGuard::NoSyncGuard(internal::Reducer* reducer)
    : reducer_(reducer), previous_(reducer->require_sync()) {
  reducer_->set_require_sync(false);
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : reducer_(other.reducer_), previous_(other.previous_) {
  other.reducer_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (reducer_ != nullptr) {
    reducer_->set_require_sync(previous_);
  }
}

// ---- Construction --------------------------------------------------------------------

DistributedDataParallelImpl::DistributedDataParallelImpl(detail::Forwarder forwarder,
                                                         std::shared_ptr<torch::nn::Module> module,
                                                         DistributedDataParallelOptions options)
    : forwarder_(std::move(forwarder)),
      module_(std::move(module)),
      state_(std::make_unique<State>(std::move(options))) {
  DDP_CHECK(module_ != nullptr,
            "DistributedDataParallel: the module is empty (a default-constructed or moved-from "
            "module holder?)");
  state_->group = state_->options.process_group();
  if (state_->group == nullptr) {
    DDP_CHECK(is_initialized(),
              "DistributedDataParallel: there is no process group to reduce over. Call "
              "ddp::init_process_group() before constructing DistributedDataParallel, or pass a "
              "group with DistributedDataParallelOptions().process_group(group).");
    state_->group = default_process_group();
  }
  DDP_CHECK(state_->group->rank() >= 0,
            "DistributedDataParallel: this process is not a member of the process group passed "
            "in process_group() (a handle that ddp::new_group gives the ranks outside the group, "
            "of size ", state_->group->size(), "); construct DistributedDataParallel only on the "
            "group's members (ddp::is_member(group))");
  const std::string prefix = who(*state_->group);
  DDP_CHECK(state_->options.bucket_cap_mb() > 0, prefix, ": bucket_cap_mb must be positive (got ",
            state_->options.bucket_cap_mb(), ")");
  DDP_CHECK(state_->options.first_bucket_cap_mb() > 0, prefix,
            ": first_bucket_cap_mb must be positive (got ", state_->options.first_bucket_cap_mb(), ")");
  DDP_CHECK(state_->options.device_ids().size() <= 1, prefix,
            ": device_ids must hold at most one device, this process's (got ",
            state_->options.device_ids().size(), "); use one process per GPU");
  register_module("module", module_);

  // Parameters, each once even if shared between submodules.
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  std::vector<bool> sparse_gradients; // per entry of `parameters`
  std::vector<at::Tensor> all_parameters;
  const auto sparse_weights = sparse_gradient_weights(*module_);
  std::unordered_set<const void*> seen;
  const std::unordered_set<std::string> ignored = checked_ignored_names(*module_, state_->options, prefix);
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second || ignored.count(item.key()) > 0) {
      continue;
    }
    DDP_CHECK(!p.is_sparse(), prefix, ": parameter '", item.key(),
              "' is sparse; only dense parameters are supported");
    if (!parameters.empty()) {
      DDP_CHECK(p.device() == parameters.front().device(), prefix, ": parameter '", item.key(),
                "' is on ", p.device(), " but '", names.front(), "' is on ",
                parameters.front().device(),
                "; a replica must live on one device (move the module with ->to(device) first)");
    }
    all_parameters.push_back(p);
    if (p.requires_grad()) {
      names.push_back(item.key());
      parameters.push_back(p);
      sparse_gradients.push_back(sparse_weights.count(p.unsafeGetTensorImpl()) > 0);
    }
  }
  if (!state_->options.device_ids().empty() && !all_parameters.empty()) {
    DDP_CHECK(all_parameters.front().device() == state_->options.device_ids().front(), prefix,
              ": device_ids is {", state_->options.device_ids().front(), "} but the parameters are on ",
              all_parameters.front().device(), "; move the module there before wrapping it");
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second && ignored.count(item.key()) == 0) {
      state_->buffers.push_back(item.value());
    }
  }

  if (state_->group->rank() == 0 && (all_parameters.empty() || all_parameters.front().is_cpu())) {
    warn_if_reference_blas(prefix);
  }

  // Construction is a synchronisation point: agree on the model, then take
  // rank 0's values.
  if (!all_parameters.empty()) {
    state_->device = all_parameters.front().device();
  }
  if (state_->options.init_sync()) {
    verify_same_parameters(*state_->group, names, parameters, sparse_gradients, state_->device);
  }
  // After the check, so that every rank (holding the same model) raises.
  DDP_CHECK(!parameters.empty(), prefix,
            ": the module has no parameter that requires a gradient (",
            all_parameters.empty() ? std::string("it has no parameters")
                                   : c10::str("all ", all_parameters.size(),
                                              " of its parameters have requires_grad() false"),
            "); DistributedDataParallel averages gradients, so it is not needed here. Expected at "
            "least one parameter that requires a gradient; use the module without "
            "DistributedDataParallel");
  // Here rather than in backward, and after the check above, so that every
  // rank (holding the same model and group) raises the same error.
  for (size_t i = 0; i < parameters.size(); ++i) {
    DDP_CHECK(!sparse_gradients[i] || state_->group->supports_sparse_allreduce(state_->device.type()), prefix,
              ": parameter '", names[i],
              "' gets sparse gradients (the weight of an Embedding or EmbeddingBag with "
              "sparse(true)), but this process group (backend ", state_->group->backend_name(),
              ") cannot allreduce sparse tensors on ", state_->device,
              ". Only the Gloo backend reduces sparse gradients: create the group with "
              "Backend::kGloo, or construct the module with sparse(false)");
  }
  if (state_->options.init_sync()) {
    std::vector<at::Tensor> state = all_parameters;
    state.insert(state.end(), state_->buffers.begin(), state_->buffers.end());
    internal::CollectiveLabel label("DDP construction: rank 0's parameters and buffers");
    internal::broadcast_coalesced(*state_->group, state, 0);
  }

  internal::ReducerConfig config;
  config.first_bucket_bytes = mebibytes_to_bytes(state_->options.first_bucket_cap_mb());
  config.bucket_bytes = mebibytes_to_bytes(state_->options.bucket_cap_mb());
  config.find_unused_parameters = state_->options.find_unused_parameters();
  config.gradient_as_bucket_view = state_->options.gradient_as_bucket_view();
  config.static_graph = state_->options.static_graph();
  if (state_->options.static_graph() && state_->options.find_unused_parameters()) {
    // As PyTorch, which warns too.
    internal::log_warning(c10::str(
        prefix, ": find_unused_parameters(true) has no effect with static_graph(true): the first "
        "iteration finds the unused parameters, which must then stay the same in every "
        "iteration"));
  }
  config.print_insight = internal::env_get(internal::kEnvDebug).value_or("0") == "1";
  config.sparse_gradients = std::move(sparse_gradients);
  state_->reducer = std::make_shared<internal::Reducer>(std::move(parameters), std::move(names), state_->group,
                                                 config);
}

DistributedDataParallelImpl::~DistributedDataParallelImpl() = default;

c10::Device DistributedDataParallelImpl::device() const {
  return state_->device;
}

const std::shared_ptr<ProcessGroup>& DistributedDataParallelImpl::process_group() const {
  return state_->group;
}

// ---- Forward -----------------------------------------------------------------------------

void DistributedDataParallelImpl::pre_forward() {
  state_->reducer->record_forward_event(internal::IterationTimer::Event::kForwardStart);
  nn::detail::enable_batch_norms_in_place(); // Note [BatchNorms synchronised in place]
  if (at::GradMode::is_enabled()) {
    internal::plan_begin_step(); // Note [Plan report]: steps as the timeline's
  }
  if (internal::Timeline* timeline = internal::Timeline::get(); timeline && at::GradMode::is_enabled()) {
    timeline->begin_step(); // Note [Timeline]: a step begins with a forward with gradients
    state_->timeline_forward_start_us = internal::Timeline::now_us();
  }
  const bool will_sync_gradients = at::GradMode::is_enabled() && state_->reducer->require_sync();
  // As PyTorch: after a forward under no_sync() or without gradients, the
  // buffers are not broadcast (each rank keeps its own statistics until the
  // next synchronised step).
  const bool will_sync_buffers =
      state_->options.broadcast_buffers() && !state_->buffers.empty() && state_->last_forward_synchronised;
  int buffer_root = 0;
  if (state_->join != nullptr) {
    buffer_root = state_->join->on_forward(will_sync_gradients, will_sync_buffers);
  }
  state_->reducer->prepare_for_forward();
  if (will_sync_buffers) {
    // See Note [Buffers of a live graph] in state_sync.cpp.
    internal::CollectiveLabel label("DDP buffer broadcast");
    internal::broadcast_coalesced(*state_->group, state_->buffers, buffer_root,
                                  internal::VersionCounters::kPreserve);
  }
}

void DistributedDataParallelImpl::post_forward(const std::vector<at::Tensor*>& outputs) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(outputs.size());
  for (const at::Tensor* output : outputs) {
    tensors.push_back(*output);
  }
  state_->last_forward_synchronised = at::GradMode::is_enabled() && state_->reducer->require_sync();
  // Before prepare_for_backward, which does not change it.
  const bool first_static_iteration = state_->reducer->static_graph_first_iteration();
  if (at::GradMode::is_enabled()) {
    state_->reducer->prepare_for_backward(tensors);
  }
  const bool walks_graph = state_->options.find_unused_parameters() && !state_->options.static_graph();
  if ((walks_graph || first_static_iteration) && at::GradMode::is_enabled()) {
    // See Note [Outputs through one node]. Tensors outside any graph (no
    // grad_fn) are left alone, as PyTorch does.
    std::vector<size_t> routed;
    torch::autograd::variable_list inputs;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (tensors[k].defined() && tensors[k].grad_fn() != nullptr) {
        routed.push_back(k);
        inputs.push_back(tensors[k]);
      }
    }
    if (!inputs.empty()) {
      std::weak_ptr<internal::Reducer> delayed;
      if (first_static_iteration) {
        delayed = state_->reducer;
      }
      auto copies = OutputSink::apply(at::TensorList(inputs), delayed);
      for (size_t j = 0; j < routed.size(); ++j) {
        *outputs[routed[j]] = std::move(copies[j]);
      }
    }
  }
  state_->reducer->record_forward_event(internal::IterationTimer::Event::kForwardEnd);
  if (state_->timeline_forward_start_us != 0) {
    internal::Timeline::get()->complete(internal::Timeline::kStepTrack, "forward", state_->timeline_forward_start_us,
                                        internal::Timeline::now_us());
    state_->timeline_forward_start_us = 0;
  }
}

NoSyncGuard DistributedDataParallelImpl::no_sync() {
  return NoSyncGuard(state_->reducer.get());
}

void DistributedDataParallelImpl::register_comm_hook(CommHook hook) {
  std::shared_ptr<CommHookState> hook_state = comm_hooks::state_of(hook);
  state_->reducer->set_comm_hook(std::move(hook));
  state_->comm_hook_state = std::move(hook_state);
}

std::shared_ptr<CommHookState> DistributedDataParallelImpl::comm_hook_state() const {
  return state_->comm_hook_state;
}

void DistributedDataParallelImpl::register_bucket_reduced_hook(
    BucketReducedHook hook, std::function<int(const at::Tensor&)> gradient_owner) {
  DDP_CHECK(state_->join == nullptr, who(*state_->group),
            " register_bucket_reduced_hook: not while a ddp::Join is live");
  state_->reducer->set_bucket_consumer({std::move(hook), std::move(gradient_owner)});
}

IterationInsight DistributedDataParallelImpl::last_iteration_insight() const {
  return state_->reducer->last_insight();
}

std::vector<BucketInsight> DistributedDataParallelImpl::bucket_layout() const {
  return state_->reducer->layout();
}

double DistributedDataParallelImpl::max_parameter_difference_across_ranks() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  const auto& ignored = state_->options.params_and_buffers_to_ignore();
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (std::find(ignored.begin(), ignored.end(), item.key()) != ignored.end()) {
      continue; // each rank keeps its own
    }
    const at::Tensor p = item.value().detach();
    flat.push_back((p.is_complex() ? at::view_as_real(p) : p).reshape({-1}).to(at::kDouble));
  }
  if (flat.empty() || state_->group->size() == 1) {
    return 0.0;
  }
  auto mine = at::cat(flat);
  auto reference = mine.clone();
  state_->group->broadcast(reference, {0})->wait();
  auto difference = (mine - reference).abs().max().reshape({1});
  state_->group->allreduce(difference, {ReduceOp::kMax})->wait();
  return difference.item<double>();
}

std::string IterationInsight::to_string() const {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << "DDP iteration " << iteration << ": forward " << forward_ms << " ms, backward "
      << backward_compute_ms << " ms, communication " << comm_ms << " ms ("
      << static_cast<int>(overlap_fraction * 100 + 0.5) << "% overlapped with backward), waited "
      << comm_wait_ms << " ms at the end of backward; " << buckets.size() << " bucket(s):";
  for (const auto& bucket : buckets) {
    out << "\n  bucket " << bucket.index << ": " << bucket.parameter_names.size()
        << " parameter(s), " << bucket.bytes << " bytes " << bucket.dtype
        << (bucket.sparse ? " (sparse)" : "") << ", started at "
        << bucket.launch_ms << " ms, done at " << bucket.done_ms << " ms";
  }
  return out.str();
}

} // namespace ddp
