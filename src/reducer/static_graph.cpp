// static_graph: the Reducer's first iteration, which only counts gradient
// hooks and reduces at the end of backward, and the checks of later ones.
//
// Note [Delayed reduction]: with static_graph, the user promises that every
// synchronised iteration has the first one's graph. A parameter's hook may
// fire more than once in a backward (a layer run twice under reentrant
// activation checkpointing: each nested backward runs its gradient
// accumulator), so in the first iteration no hook can tell that its
// gradient is final. There, hooks only *count* (kRecording), and the whole
// reduction is *delayed* to the end of backward: the outputs pass through
// DistributedDataParallel's output sink, whose backward runs first, in the
// outermost backward, and queues `delayed_reduction` there (a callback
// queued from a hook inside a nested backward would run when that nested
// backward ends). The delayed reduction marks every variable ready in index
// order, allreduces the usage flags with the buckets, and records: each
// variable's hook count, the variables with none (*static unused*), the
// usage sums over ranks, and the ready order (static unused first, then by
// each variable's last hook) for the bucket rebuild before iteration 2. In
// later iterations there is no graph walk and no sink: the static unused
// variables are marked ready at the first hook, a variable is ready at its
// recorded count of hooks, and a variable unused on every rank in the first
// iteration keeps its gradient untouched. One hook more than recorded is an
// error at once ("the training graph changed"); fewer leave the reduction
// unfinished, which the next forward reports with the counts.

#include "reducer/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <chrono>

#include "internal/check.h"

namespace ddp::internal {

bool Reducer::static_graph_first_iteration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return config_.static_graph && iteration_ == 0 && require_sync_;
}

void Reducer::check_static_graph_hook(size_t index) {
  if (hooks_remaining_[index] > 0) {
    return;
  }
  const std::string message = c10::str(
      who(), ": static_graph: parameter '", names_[index], "' got gradient number ",
      hook_counts_[index] + 1, " in this backward, but the first iteration gave it ",
      hook_counts_[index],
      ". The training graph changed (a parameter unused in the first iteration is used now, or "
      "a layer runs more often); static_graph requires the same graph in every iteration: "
      "construct DistributedDataParallel without static_graph (and with "
      "find_unused_parameters(true) if parameters go unused in some iterations).");
  // Leave the reducer usable in case the caller handles the error: what
  // this iteration launched is dropped (the Work keeps its tensors alive).
  reset_iteration();
  throw_check_error(__func__, __FILE__, __LINE__, message);
}

void Reducer::queue_delayed_reduction() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!config_.static_graph || iteration_ != 0 || !require_sync_ || state_ != State::kArmed) {
    return; // not the first static iteration, or queued already
  }
  queue_delayed_reduction_locked();
}

void Reducer::queue_delayed_reduction_locked() {
  state_ = State::kRecording;
  timer_.record(IterationTimer::Event::kBackwardStart);
  // Runs when the backward that queued it has finished, on the engine thread.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { delayed_reduction(); });
}

void Reducer::delayed_reduction() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::kRecording) {
    return; // reset since
  }
  state_ = State::kReducing;
  const size_t n = parameters_.size();
  static_unused_.clear();
  std::vector<size_t> used;
  for (size_t i = 0; i < n; ++i) {
    (hook_counts_[i] == 0 ? static_unused_ : used).push_back(i);
  }
  // The order of later iterations: the static unused at the first hook,
  // the others at their last.
  std::sort(used.begin(), used.end(),
            [this](size_t a, size_t b) { return last_hook_[a] < last_hook_[b]; });
  ready_order_ = static_unused_;
  ready_order_.insert(ready_order_.end(), used.begin(), used.end());
  for (size_t i = 0; i < n; ++i) {
    mark_variable_ready(i);
  }
  DDP_INTERNAL_ASSERT(state_ == State::kFinalizing);
  finalize_backward_guarded();
}

} // namespace ddp::internal
