// The Reducer.
//
// How it works. At construction every parameter that requires a gradient
// becomes a *variable*, and variables are grouped into *buckets* (see
// bucket_assignment.h): flat buffers, one per group, with a *view* per
// variable. A post hook on each variable's gradient accumulator tells us when
// autograd has written that variable's gradient.
//
// An iteration: `prepare_for_backward` (end of forward) arms the hooks. Each
// hook marks its variable *ready*: the gradient is copied into its bucket view
// (or, with gradient_as_bucket_view, already is that view). When a bucket's
// last variable is ready the bucket is ready, and ready buckets are *launched*
// strictly in bucket order, so that every rank issues the same collectives in
// the same order even if gradients become ready in a different order: the
// communication hook (default: divide by world size, allreduce) runs
// asynchronously while backward goes on. When the last bucket has launched,
// `finalize_backward` is queued to run when backward ends: it waits for every
// bucket and writes the reduced values back into the gradients.
//
// find_unused_parameters: after forward we walk the autograd graph from the
// outputs; variables whose accumulator is not reached are *unused* and are
// marked ready (with their current gradient, or zeros) at the first hook.
// Variables behind an output that the loss does not use are reached by the
// walk but get an undefined gradient in backward (Note [Outputs through one
// node] in distributed_data_parallel.cpp): their hooks mark them ready, and
// they are not counted as used. A per-variable usage count is allreduced
// too, and a variable unused on every rank keeps its gradient untouched.
//
// After the first iteration the buckets are rebuilt in the order gradients
// actually became ready, using rank 0's order on every rank (broadcast).
//
// static_graph: see Note [Delayed reduction] in static_graph.cpp. The
// iteration's figures (insight, bucket layout) are computed in
// reducer_insight.cpp, sparse gradients written back in sparse_gradients.cpp.
//
// Note [Sparse gradients]: the weight of an Embedding or EmbeddingBag with
// sparse(true) gets a sparse COO gradient, which no flat buffer can hold.
// As in PyTorch, such a variable has a bucket of its own (c10d's
// expect_sparse_gradient; see bucket_assignment.h) whose `buffer` is the
// gradient itself, and the communication hook reduces it with the group's
// sparse allreduce (the default hook divides it by the world size in place
// first), which leaves it coalesced; DistributedDataParallel has checked at
// construction that the group can. A rank where the variable has no
// gradient (unused under find_unused_parameters, or shadowing under Join)
// sends an empty one, sparse in the first dimension as an Embedding's is. At
// the end of backward the result is written back into the gradient. A
// gradient that came out dense (the weight also took part in a dense
// operation) is sent sparse and written back dense.
//
// Note [Built-in allreduce]: with no communication hook registered (the
// default, PyTorch's `comm_hook is None`), a dense gradient is multiplied by
// 1 / world size as it is copied into its bucket view (one pass over the
// gradient instead of a copy and then a division of the whole bucket), and
// the bucket is then allreduced with SUM. PyTorch's Reducer does the same,
// with the same arithmetic (a product with the reciprocal, rounded to the
// gradient's dtype), so each rank's share is rounded as PyTorch rounds it;
// only the order of the sum can differ.
// A gradient that already is its view (gradient_as_bucket_view) is divided
// in place. A registered hook, comm_hooks::allreduce() included, gets the
// undivided bucket and divides it itself; sparse buckets always go through
// the hook.
//
// Note [Bucket views]: `Bucket::views[k]` aliases elements
// [offset_k, offset_k + numel_k) of `buffer`, shaped like variable k. It
// shares the buffer's storage but is not an autograd view of it, because
// LibTorch's Optimizer::zero_grad() calls detach_(), which views refuse. With
// gradient_as_bucket_view the parameter's `grad()` *is* that view, so the
// allreduce result lands in the gradient with no copy; autograd then
// accumulates into the view in place. If the user replaces the gradient
// (e.g. zero_grad with set_to_none), the next mark-ready copies the new
// gradient into the view and points `grad()` back at it.

#include "reducer/reducer.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>

#include "comm/collective_label.h"
#include "internal/check.h"
#include "reducer/bucket_assignment.h"

namespace ddp::internal {

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 std::shared_ptr<ProcessGroup> group, ReducerConfig config)
    : parameters_(std::move(parameters)),
      names_(std::move(names)),
      group_(std::move(group)),
      config_(config),
      device_(parameters_.empty() ? c10::Device(c10::kCPU) : parameters_.front().device()),
      comm_hook_(comm_hooks::allreduce()) {
  const size_t n = parameters_.size();
  DDP_INTERNAL_ASSERT(config_.sparse_gradients.empty() || config_.sparse_gradients.size() == n,
                      config_.sparse_gradients.size(), " sparse flags for ", n, " parameters");
  ready_.assign(n, false);
  used_since_sync_.assign(n, false);
  hook_counts_.assign(n, 0);
  last_hook_.assign(n, 0);
  hooks_remaining_.assign(n, 0);
  usage_ = at::zeros({static_cast<int64_t>(n)}, at::TensorOptions(at::kInt).device(device_));

  initialize_buckets(compute_bucket_assignment_by_size(
      gradient_specs(), {config_.first_bucket_bytes, config_.bucket_bytes}));

  grad_accumulators_.resize(n);
  hook_keys_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[i]);
    DDP_INTERNAL_ASSERT(static_cast<bool>(accumulator), "parameter ", names_[i], " has no gradient accumulator");
    install_hook(i, std::move(accumulator));
  }
}

void Reducer::install_hook(size_t index, AutogradNodePtr accumulator) {
  // The hook runs on the autograd engine thread; `this` outlives it because
  // the destructor removes the hook first.
  hook_keys_[index] = accumulator->add_post_hook(
      std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, index](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list& /*inputs*/) {
            autograd_hook(index);
            return outputs;
          }));
  grad_accumulators_[index] = std::move(accumulator);
}

void Reducer::rehook_replaced_parameters() {
  // `param.set_(...)` (what torch::load does) gives a parameter a new
  // gradient accumulator, and our hook stays on the old one: without this,
  // its gradient would silently stop being reduced.
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto current = torch::autograd::impl::try_get_grad_accumulator(parameters_[i]);
    if (current && current != grad_accumulators_[i]) {
      grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
      install_hook(i, std::move(current));
    }
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) {
    grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

std::string Reducer::who() const {
  return c10::str("[rank ", group_->rank(), "/", group_->size(), "] DistributedDataParallel");
}

std::string Reducer::names_of(const std::vector<size_t>& indices) const {
  std::string text;
  for (size_t k = 0; k < indices.size(); ++k) {
    text += (k == 0 ? "" : ", ") + names_[indices[k]];
  }
  return text;
}

std::vector<GradientSpec> Reducer::gradient_specs() const {
  std::vector<GradientSpec> specs;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& p = parameters_[i];
    const bool sparse = !config_.sparse_gradients.empty() && config_.sparse_gradients[i];
    specs.push_back({p.scalar_type(), p.device(), static_cast<size_t>(p.nbytes()), sparse});
  }
  return specs;
}

size_t Reducer::bucket_bytes(const Bucket& bucket) const {
  return bucket.sparse ? bucket.sparse_bytes
                       : static_cast<size_t>(bucket.numel) *
          parameters_[bucket.variable_indices.front()].element_size();
}

void Reducer::initialize_buckets(const std::vector<std::vector<size_t>>& assignment) {
  std::vector<Bucket> buckets;
  std::vector<VariableLocator> locators(parameters_.size());
  const auto specs = gradient_specs();
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    if (specs[assignment[b].front()].sparse) {
      // See Note [Sparse gradients]: one variable, no buffer until its
      // gradient is ready.
      const size_t index = assignment[b].front();
      DDP_INTERNAL_ASSERT(assignment[b].size() == 1, "a sparse bucket of ", assignment[b].size());
      bucket.sparse = true;
      bucket.variable_indices.push_back(index);
      bucket.parameter_names = std::make_shared<const std::vector<std::string>>(
          std::vector<std::string>{names_[index]});
      locators[index] = {b, 0};
      buckets.push_back(std::move(bucket));
      continue;
    }
    std::vector<std::string> names;
    for (size_t k = 0; k < assignment[b].size(); ++k) {
      const size_t index = assignment[b][k];
      bucket.numel += parameters_[index].numel();
      bucket.variable_indices.push_back(index);
      names.push_back(names_[index]);
      locators[index] = {b, k};
    }
    // A collective: every rank builds the same buckets at the same point
    // (here, at construction, or after rebuild_buckets_if_due's broadcast).
    if (!releases_buckets()) {
      allocate_bucket(bucket, true);
    }
    bucket.parameter_names = std::make_shared<const std::vector<std::string>>(std::move(names));
    buckets.push_back(std::move(bucket));
  }
  buckets_ = std::move(buckets);
  locators_ = std::move(locators);
}

void Reducer::allocate_bucket(Bucket& bucket, bool collective) {
  const auto options = parameters_[bucket.variable_indices.front()].options().requires_grad(false);
  bucket.buffer = collective ? group_->allocate_collective_buffer(bucket.numel, options)
                             : at::empty({bucket.numel}, options);
  // Where each variable goes: in bucket order, or grouped by keeper
  // (Note [Released buckets]).
  const size_t n = bucket.variable_indices.size();
  std::vector<int64_t> offsets(n);
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) {
    order[k] = k;
  }
  if (consumer_.keeper) {
    std::vector<int> keeper(n);
    for (size_t k = 0; k < n; ++k) {
      keeper[k] = consumer_.keeper(parameters_[bucket.variable_indices[k]]);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keeper[a] < keeper[b]; });
  }
  int64_t offset = 0;
  for (const size_t k : order) {
    offsets[k] = offset;
    offset += parameters_[bucket.variable_indices[k]].numel();
  }
  bucket.views.clear();
  for (size_t k = 0; k < n; ++k) {
    const auto& p = parameters_[bucket.variable_indices[k]];
    const int64_t offset = offsets[k];
    // Shares the buffer's storage without being an autograd view, so that
    // LibTorch's Optimizer::zero_grad() may detach_() it (it cannot detach
    // a view in place).
    auto view = at::empty({0}, bucket.buffer.options());
    view.set_(bucket.buffer.storage(), offset, p.sizes(), c10::contiguous_strides(p.sizes()));
    // See Note [Bucket views]: keep the gradient the user already has.
    if (config_.gradient_as_bucket_view && !releases_buckets() && p.grad().defined()) {
      view.copy_(p.grad());
      const_cast<at::Tensor&>(p).mutable_grad() = view;
    }
    bucket.views.push_back(std::move(view));
  }
}

bool Reducer::require_sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return require_sync_;
}

void Reducer::set_require_sync(bool value) {
  std::lock_guard<std::mutex> lock(mutex_);
  require_sync_ = value;
}

void Reducer::set_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  DDP_CHECK(hook != nullptr, who(), ": register_comm_hook: the hook is empty");
  DDP_CHECK(state_ == State::kIdle && iteration_ == 0, who(),
            ": register_comm_hook must be called before the first backward");
  comm_hook_ = std::move(hook);
  builtin_hook_ = false;
}

// ---- Forward side --------------------------------------------------------------

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == State::kReducing || state_ == State::kFinalizing) {
    const std::string message = unfinished_reduction_message();
    // Leave the reducer usable in case the caller handles the error.
    reset_iteration();
    throw_check_error(__func__, __FILE__, __LINE__, message);
  }
  // A forward with no backward since (evaluation with gradients on): nothing
  // was reduced, so nothing is owed.
  reset_iteration();
  rebuild_buckets_if_due();
}

std::string Reducer::unfinished_reduction_message() const {
  std::vector<size_t> missing;
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (!ready_[i]) {
      missing.push_back(i);
    }
  }
  if (config_.static_graph && iteration_ > 0) {
    std::string counts;
    for (size_t k = 0; k < missing.size(); ++k) {
      const size_t i = missing[k];
      counts += c10::str(k == 0 ? "" : ", ", names_[i], " (", hook_counts_[i] - hooks_remaining_[i],
                         " of ", hook_counts_[i], ")");
    }
    return c10::str(
        who(), ": expected to have finished reduction in the prior iteration before starting a "
        "new one. With static_graph, every backward must bring each parameter as many gradients "
        "as the first iteration did, but the previous one brought fewer to ",
        missing.size(), " parameter(s): ", counts,
        ". The training graph changed (a parameter went unused, or a layer ran fewer times); "
        "static_graph requires the same graph in every iteration: construct "
        "DistributedDataParallel without static_graph (and with find_unused_parameters(true) if "
        "parameters go unused in some iterations).");
  }
  return c10::str(
      who(), ": expected to have finished reduction in the prior iteration before starting a "
      "new one. The previous backward produced no gradient for ",
      missing.size(), " parameter(s): ", names_of(missing),
      ". Either make every parameter take part in computing the loss on every rank, or "
      "construct DistributedDataParallel with "
      "DistributedDataParallelOptions().find_unused_parameters(true).");
}

void Reducer::rebuild_buckets_if_due() {
  // As PyTorch: once, after the first iteration, and not when unused
  // parameters may differ from one iteration to the next.
  if (buckets_rebuilt_ || iteration_ < 1 ||
      (config_.find_unused_parameters && !config_.static_graph)) {
    return;
  }
  buckets_rebuilt_ = true;
  const int64_t n = static_cast<int64_t>(parameters_.size());
  auto order = at::full({n}, -1, at::kLong);
  if (ready_order_.size() == parameters_.size()) {
    for (int64_t k = 0; k < n; ++k) {
      order[k] = static_cast<int64_t>(ready_order_[k]);
    }
  }
  if (group_->size() > 1) {
    // Every rank takes rank 0's order, so that all build the same buckets.
    auto on_device = order.to(device_);
    internal::CollectiveLabel label("DDP bucket rebuild");
    group_->broadcast(on_device, {0})->wait();
    order = on_device.cpu();
  }
  if (n == 0 || order[0].item<int64_t>() < 0) {
    return; // rank 0 has no complete order (e.g. it only shadowed): keep the buckets
  }
  std::vector<size_t> fill_order(n);
  for (int64_t k = 0; k < n; ++k) {
    fill_order[k] = static_cast<size_t>(order[k].item<int64_t>());
  }
  initialize_buckets(compute_bucket_assignment_by_size(
      gradient_specs(), {config_.first_bucket_bytes, config_.bucket_bytes}, fill_order));
}

void Reducer::reset_iteration() {
  state_ = State::kIdle;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.variable_indices.size();
    bucket.work.reset();
    bucket.ready_ms = 0;
    bucket.launch_ms = 0;
    bucket.done_ms = 0;
    if (bucket.sparse) {
      bucket.buffer = at::Tensor(); // the last gradient: not ours to keep
    }
  }
  next_bucket_ = 0;
  next_finished_ = 0;
  early_comm_wait_ms_ = 0;
  unused_.clear();
  usage_work_.reset();
  hooks_seen_ = 0;
  hooks_remaining_ = hook_counts_;
}

bool Reducer::reduces_usage() const {
  // A static graph's usage is reduced once (Note [Delayed reduction] in
  // static_graph.cpp).
  return config_.static_graph ? iteration_ == 0 : config_.find_unused_parameters;
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!require_sync_) {
    return;
  }
  reset_iteration();
  state_ = State::kArmed;
  rehook_replaced_parameters();
  if (config_.static_graph) {
    // See Note [Delayed reduction]: counted afresh until an iteration
    // finishes, then fixed.
    if (iteration_ == 0) {
      std::fill(hook_counts_.begin(), hook_counts_.end(), 0);
      hooks_remaining_ = hook_counts_;
    } else {
      unused_ = static_unused_;
    }
    return;
  }
  if (!config_.find_unused_parameters) {
    return;
  }
  DDP_CHECK(!outputs.empty(), who(),
            ": find_unused_parameters needs the tensors of the forward's output, but the wrapped "
            "module's forward returned a type DDP cannot look into (supported: a tensor, a "
            "std::vector of tensors, a std::tuple of those)");
  // Walk the autograd graph from the outputs; accumulators not reached belong
  // to unused parameters.
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& output : outputs) {
    if (output.defined() && output.grad_fn()) {
      stack.push_back(output.grad_fn().get());
    }
  }
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) {
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) {
        stack.push_back(edge.function.get());
      }
    }
  }
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) {
    if (seen.count(grad_accumulators_[i].get()) == 0) {
      unused_.push_back(i);
    }
  }
}

// ---- Backward side (autograd engine thread) ---------------------------------------

void Reducer::autograd_hook(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The hook also runs when autograd brings an undefined gradient: an output
  // the loss did not use (Note [Outputs through one node] in
  // distributed_data_parallel.cpp). As PyTorch's, such a parameter counts
  // as used only if it has a gradient, so that one unused everywhere keeps
  // its gradient untouched.
  if (parameters_[index].grad().defined()) {
    used_since_sync_[index] = true;
  }
  if (!require_sync_ || state_ == State::kIdle) {
    // no_sync(), or a backward that did not start from a DDP forward:
    // gradients just accumulate locally.
    return;
  }
  if (config_.static_graph && iteration_ == 0) {
    // Only count (Note [Delayed reduction] in static_graph.cpp). The
    // output sink has queued the reduction, unless the outputs held no
    // tensor it could see; then this hook queues it, which is right unless
    // it runs in a nested backward.
    if (state_ == State::kArmed) {
      queue_delayed_reduction_locked();
    }
    ++hook_counts_[index];
    last_hook_[index] = hooks_seen_++;
    return;
  }
  if (state_ == State::kArmed) {
    state_ = State::kReducing;
    timer_.record(IterationTimer::Event::kBackwardStart);
    for (size_t unused : unused_) {
      mark_variable_ready(unused);
    }
  }
  if (config_.static_graph) {
    check_static_graph_hook(index);
    if (--hooks_remaining_[index] > 0) {
      return; // more gradient to come for it in this backward
    }
  }
  mark_variable_ready(index);
  if (state_ == State::kFinalizing) {
    queue_finalize();
  }
}

void Reducer::mark_variable_ready(size_t index) {
  DDP_CHECK(state_ == State::kReducing, who(), ": parameter '", names_[index],
            "' got a gradient after all buckets were reduced in this iteration. A parameter "
            "must get at most one gradient per backward: this happens with two backward passes "
            "over one forward (retain_graph), or when find_unused_parameters counted it as unused "
            "but it was used after all");
  DDP_CHECK(!ready_[index], who(), ": parameter '", names_[index],
            "' was marked ready twice in one iteration (two backward passes over one forward, a "
            "parameter shared between modules, or a reentrant backward such as a layer run "
            "twice under activation checkpointing); DDP reduces each gradient once per "
            "iteration. If the graph is the same in every iteration, construct "
            "DistributedDataParallel with static_graph(true)");
  ready_[index] = true;
  if (iteration_ == 0 && !shadowing_ && !config_.static_graph) {
    ready_order_.push_back(index);
  }
  const auto& locator = locators_[index];
  Bucket& bucket = buckets_[locator.bucket_index];
  const auto& param = parameters_[index];
  const at::Tensor& grad = param.grad();
  if (bucket.sparse) {
    // See Note [Sparse gradients]. Reduced in place, as PyTorch does.
    if (shadowing_ || !grad.defined()) {
      bucket.buffer = empty_sparse_gradient(param);
    } else {
      bucket.buffer = grad.is_sparse() ? grad : grad.to_sparse(1);
    }
  } else {
    DDP_CHECK(!grad.defined() || !grad.is_sparse(), who(), ": parameter '", names_[index],
              "' got a sparse gradient, but DistributedDataParallel expects one only for the "
              "weight of a torch::nn::Embedding or torch::nn::EmbeddingBag constructed with "
              "sparse(true); compute it with one of those modules, or densely");
    const bool release = releases_buckets() && !shadowing_;
    if (!bucket.buffer.defined()) {
      allocate_bucket(bucket, false); // Note [Released buckets]
    }
    at::Tensor& view = bucket.views[locator.intra_bucket_index];
    bucket.in_place.resize(bucket.views.size());
    bucket.in_place[locator.intra_bucket_index] = at::Tensor();
    if (shadowing_ || !grad.defined()) {
      view.zero_();
    } else if (config_.gradient_as_bucket_view && !release && grad.is_alias_of(view)) {
      if (divides_on_copy()) {
        view.div_(divisor());
      }
    } else if (takes_in_place(bucket, index, grad)) {
      bucket.in_place[locator.intra_bucket_index] = grad; // Note [Gradients in place]
    } else {
      copy_into_view(grad, view);
      if (release) {
        // In its bucket now; the keeper gets the reduced one back at write-back.
        const_cast<at::Tensor&>(param).mutable_grad() = at::Tensor();
      } else if (config_.gradient_as_bucket_view && !release) {
        const_cast<at::Tensor&>(param).mutable_grad() = view;
      }
    }
  }
  timer_.record(IterationTimer::Event::kBackwardEnd);
  if (--bucket.pending == 0) {
    bucket.ready_ms = timer_.ms_since(IterationTimer::Event::kBackwardStart);
    launch_ready_buckets();
  }
}

bool Reducer::divides_on_copy() const {
  return builtin_hook_ && group_->size() > 1;
}

void Reducer::set_divisor(int ranks) {
  DDP_INTERNAL_ASSERT(ranks >= 0 && ranks <= group_->size(), "divisor ", ranks);
  std::lock_guard<std::mutex> lock(mutex_);
  divisor_ = ranks;
}

double Reducer::divisor() const {
  return static_cast<double>(divisor_ > 0 ? divisor_ : group_->size());
}

void Reducer::copy_into_view(const at::Tensor& grad, at::Tensor& view) {
  if (!divides_on_copy()) {
    view.copy_(grad);
    return;
  }
  // See Note [Built-in allreduce]. A scalar wrapped as PyTorch wraps Python
  // numbers, so that the product keeps the gradient's dtype.
  const auto scale = at::native::wrapped_scalar_tensor(1.0 / divisor());
  if (grad.requires_grad()) {
    // create_graph=true: an out= kernel refuses inputs that require grad.
    view.copy_(grad.mul(scale));
  } else {
    at::mul_out(view, grad, scale);
  }
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    if (finishes_early()) {
      // See Note [Bucket reduced hook] in reducer_finalize.cpp.
      while (next_bucket_ - next_finished_ > kUnfinishedAtLaunch) {
        early_comm_wait_ms_ += wait_for_bucket(next_finished_);
        write_back_bucket(next_finished_++, config_.static_graph ? static_usage_ : at::Tensor());
      }
    }
    launch_bucket(next_bucket_, buckets_[next_bucket_].buffer);
    ++next_bucket_;
  }
  if (next_bucket_ < buckets_.size()) {
    return;
  }
  if (reduces_usage()) {
    auto usage = at::zeros({static_cast<int64_t>(used_since_sync_.size())}, at::kInt);
    if (!shadowing_) {
      auto* flags = usage.data_ptr<int>();
      for (size_t i = 0; i < used_since_sync_.size(); ++i) {
        flags[i] = used_since_sync_[i] ? 1 : 0;
      }
    }
    usage_ = usage.to(device_);
    internal::CollectiveLabel label("DDP unused-parameter map (find_unused_parameters)");
    usage_work_ = group_->size() > 1 ? group_->allreduce(usage_) : Work::completed({usage_});
  }
  state_ = State::kFinalizing;
}

void Reducer::queue_finalize() {
  // Runs when the backward pass that queued it has finished, on the engine
  // thread.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
}

void Reducer::launch_bucket(size_t bucket_index, const at::Tensor& buffer) {
  Bucket& bucket = buckets_[bucket_index];
  GradBucket grad_bucket(bucket_index, buckets_.size(), buffer,
                         bucket.sparse ? std::vector<at::Tensor>{buffer} : bucket.views,
                         bucket.parameter_names);
  bucket.launch_ms = timer_.ms_since(IterationTimer::Event::kBackwardStart);
  // Note [Built-in allreduce]: a dense bucket was divided on its way in.
  internal::CollectiveLabel label(c10::str("DDP gradient bucket ", bucket_index));
  std::shared_ptr<Work> work;
  if (builtin_hook_ && !bucket.sparse) {
    auto gradients = gradients_in_place(bucket, buffer);
    work = group_->size() == 1 ? Work::completed({buffer})
        : gradients.empty()    ? group_->allreduce(buffer)
                               : group_->reduce_gradients(buffer, std::move(gradients), 1.0 / divisor());
  } else if (builtin_hook_ && divisor_ > 0 && group_->size() > 1) {
    // A sparse bucket under Join with divide_by_initial_world_size(false):
    // the default hook's division, by the ranks still training.
    buffer.div_(divisor());
    work = group_->allreduce(buffer);
  } else {
    work = comm_hook_(*group_, grad_bucket);
  }
  DDP_CHECK(work != nullptr, who(), ": the communication hook returned no Work for bucket ",
            bucket_index);
  bucket.work = std::move(work);
}

// Note [Gradients in place]: without gradient_as_bucket_view, each
// gradient is copied into its bucket (times 1 / world size) and the reduced
// bucket back into the gradient. When the group can read the gradients
// where they lie (ProcessGroup::reduces_gradients_in_place: Gloo on one
// host, Note [Gradients read where they lie] in cross_memory.cpp), neither
// copy is made: mark-ready records the gradient in its bucket's
// `in_place`, and the bucket goes to ProcessGroup::reduce_gradients with
// those gradients, which reads them in every rank and writes the result into
// them. A gradient that the group cannot take so is copied as before, and
// the bucket holds it; the group does the same wherever it falls back.
// Write-back then has nothing to copy for the gradients in place, but bumps
// their version counters, as the copy did. Only gradients that the copy
// at write-back would have filled in exactly that way are taken: dense,
// contiguous, on the CPU, of the bucket's dtype, not requiring grad
// (create_graph), of a parameter this rank used (whose gradient the usage
// map cannot leave as it was), and with the built-in allreduce only.
bool Reducer::takes_in_place(const Bucket& bucket, size_t index, const at::Tensor& grad) const {
  const at::Tensor& view = bucket.views[locators_[index].intra_bucket_index];
  if (!builtin_hook_ || group_->size() == 1 || config_.gradient_as_bucket_view || releases_buckets() ||
      shadowing_ || !used_since_sync_[index] || !group_->reduces_gradients_in_place()) {
    return false;
  }
  if (config_.static_graph && static_usage_.defined() && static_usage_.data_ptr<int>()[index] == 0) {
    return false;
  }
  return grad.defined() && grad.layout() == at::kStrided && grad.is_cpu() && !grad.requires_grad() &&
         grad.scalar_type() == view.scalar_type() && grad.is_contiguous() && grad.numel() == view.numel() &&
         !grad.is_inference() && !grad.is_alias_of(bucket.buffer);
}

std::vector<ReduceTarget> Reducer::gradients_in_place(const Bucket& bucket, const at::Tensor& buffer) const {
  std::vector<ReduceTarget> gradients;
  if (shadowing_ || !buffer.is_same(bucket.buffer)) {
    return gradients;
  }
  const int64_t base = bucket.buffer.storage_offset();
  for (size_t k = 0; k < bucket.in_place.size(); ++k) {
    if (bucket.in_place[k].defined()) {
      gradients.push_back(ReduceTarget{bucket.views[k].storage_offset() - base, bucket.in_place[k].view({-1})});
    }
  }
  return gradients;
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  finalize_backward_guarded();
}

void Reducer::finalize_backward_guarded() {
  try {
    finalize_backward_locked();
  } catch (...) {
    // A failed reduction leaves nothing owed: the error itself reaches the
    // caller of backward(), and the next forward must not report it again.
    std::fill(used_since_sync_.begin(), used_since_sync_.end(), false);
    reset_iteration();
    throw;
  }
}

void Reducer::shadow_backward() {
  std::unique_lock<std::mutex> lock(mutex_);
  reset_iteration();
  shadowing_ = true;
  state_ = State::kReducing;
  timer_.record(IterationTimer::Event::kBackwardStart);
  // Zero buffers in place of the real ones: this rank's gradients stay as
  // they are, and the reduced values are discarded.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    launch_bucket(b, buckets_[b].sparse
                         ? empty_sparse_gradient(parameters_[buckets_[b].variable_indices.front()])
                         : at::zeros({buckets_[b].numel},
                                     parameters_[buckets_[b].variable_indices.front()].options()));
    buckets_[b].pending = 0;
  }
  next_bucket_ = buckets_.size();
  std::fill(ready_.begin(), ready_.end(), true);
  if (reduces_usage()) {
    // As PyTorch's joined ranks: `usage_` still holds the usage sums of the
    // last synchronised step, and this rank sends them again, so that a
    // parameter that some rank used then counts as used now (the ranks
    // still training get a zero gradient there, not none). Reduced in
    // place, as a training rank's: the next shadowed step sends this one's.
    internal::CollectiveLabel label("DDP unused-parameter map (find_unused_parameters)");
    usage_work_ = group_->size() > 1 ? group_->allreduce(usage_) : Work::completed({usage_});
  }
  std::exception_ptr error;
  try {
    for (auto& bucket : buckets_) {
      bucket.work->wait();
    }
    if (usage_work_) {
      usage_work_->wait();
      // Only zero or not matters. With several finished ranks re-sending
      // the sums, they would multiply every step until int32 wrapped (as
      // PyTorch's do, in a long enough tail): keep 0 or 1.
      usage_.clamp_max_(1);
    }
  } catch (...) {
    error = std::current_exception();
  }
  shadowing_ = false;
  ++iteration_;
  reset_iteration();
  if (error) {
    std::rethrow_exception(error);
  }
}

} // namespace ddp::internal
