#pragma once

// The Reducer: DistributedDataParallel's gradient machinery (private header).
// See the narrative at the top of reducer.cpp.

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/comm_hooks/comm_hooks.h>
#include <ddp/nn/insight.h>

#include "internal/torch_compat.h"
#include "reducer/bucket_assignment.h"
#include "reducer/reducer_timer.h"

namespace ddp::internal {

struct ReducerConfig {
  size_t first_bucket_bytes = 1 << 20;
  size_t bucket_bytes = 25 << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  // See Note [Delayed reduction] in static_graph.cpp. Overrides
  // find_unused_parameters, as in PyTorch.
  bool static_graph = false;
  bool print_insight = false; // DDP_DEBUG=1, on rank 0
  // Per parameter, or empty for none: its gradient is sparse (see Note
  // [Sparse gradients] in reducer.cpp).
  std::vector<bool> sparse_gradients;
};

// Thread-safety: the training thread calls the public methods; the autograd
// engine calls `autograd_hook`, `queue_delayed_reduction`,
// `delayed_reduction` and `finalize_backward` on its thread during
// backward. All shared state is guarded by `mutex_`.
class Reducer {
 public:
  Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> group, ReducerConfig config);
  // Removes the gradient hooks; waits for nothing (pending Work keeps its
  // tensors alive by itself).
  ~Reducer();

  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Start of a forward: fails if the previous backward left a reduction
  // unfinished, and rebuilds the buckets after the first iteration (a
  // collective: rank 0's gradient order is broadcast).
  void prepare_for_forward();

  // End of a forward with gradients enabled: arms the hooks for the coming
  // backward; with find_unused_parameters, walks the graph from `outputs`.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);

  // Whether the coming backward is the first synchronised one of a static
  // graph, whose outputs must then pass through DistributedDataParallel's
  // output sink (Note [Delayed reduction] in static_graph.cpp).
  bool static_graph_first_iteration() const;

  // The output sink's backward, on the autograd engine thread, at the start
  // of the first static_graph backward: queues the delayed reduction for
  // the end of that backward (a no-op if it is queued already).
  void queue_delayed_reduction();

  // Issues exactly the collectives of a synchronised backward, with zero
  // gradients and the usage sums of the last synchronised step, leaving
  // this rank's gradients untouched (ddp::Join).
  void shadow_backward();

  bool require_sync() const;
  void set_require_sync(bool value);

  // The number of ranks whose gradients the built-in allreduce averages
  // over: 0 (the default) means the world size; ddp::Join with
  // divide_by_initial_world_size(false) sets the number of ranks still
  // training before each step. Communication hooks divide by themselves.
  void set_divisor(int ranks);

  void set_comm_hook(CommHook hook);

  // The reducer's one extension point for what consumes each bucket as
  // soon as it is reduced (an optimizer stepping during backward: the one
  // in the tree is src/optim/zero_overlap.cpp). The reducer knows nothing
  // of what the consumer does; it calls it and, if asked, keeps fewer
  // gradients.
  using BucketReducedHook =
      std::function<void(size_t bucket_index, const std::vector<at::Tensor>& parameters)>;
  struct BucketConsumer {
    // Called once per bucket of every synchronised backward, after the
    // bucket's reduced gradients are in the parameters' `.grad`, in bucket
    // order on every rank, on the autograd engine thread (during backward
    // or in its final callback): see Note [Bucket reduced hook] in
    // reducer_finalize.cpp. Not called for the buckets a joined rank
    // shadows.
    BucketReducedHook on_reduced;
    // When set, names per parameter the one rank that keeps its reduced
    // gradient (-1: every rank): the gradients are sharded. Every `.grad`
    // is then dropped once copied into its bucket, only the keeper gets
    // the reduced one back, and the buckets are laid out by keeper and
    // released between uses: Note [Released buckets] in
    // reducer_finalize.cpp.
    std::function<int(const at::Tensor&)> keeper;
  };
  // Between iterations only. An empty consumer removes the one set.
  void set_bucket_consumer(BucketConsumer consumer);
  bool has_bucket_consumer() const;

  // DDP's forward entered (kForwardStart) or returned (kForwardEnd), for
  // the insight figures.
  void record_forward_event(IterationTimer::Event event);

  IterationInsight last_insight() const;
  std::vector<BucketInsight> layout() const;

 private:
  // Where a variable's gradient lives: bucket and position in it.
  struct VariableLocator {
    size_t bucket_index = 0;
    size_t intra_bucket_index = 0;
  };

  // One flat buffer of gradients; see Note [Bucket views] in reducer.cpp.
  // A sparse bucket holds one variable and no views: its `buffer` is this
  // iteration's sparse gradient (Note [Sparse gradients]).
  struct Bucket {
    at::Tensor buffer; // undefined while released (Note [Released buckets])
    int64_t numel = 0; // dense: the buffer's elements
    bool sparse = false;
    size_t sparse_bytes = 0; // the last sparse gradient reduced: indices and values
    std::vector<at::Tensor> views; // per variable, shaped like its parameter
    std::vector<size_t> variable_indices;
    std::shared_ptr<const std::vector<std::string>> parameter_names; // of variable_indices
    size_t pending = 0; // variables not yet ready this iteration
    std::shared_ptr<Work> work;
    double ready_ms = 0; // its last gradient ready, as launch_ms after the first
    double launch_ms = 0;
    double done_ms = 0; // its Work's completion, once a released bucket has dropped it
    // Per variable: this iteration's gradient when it is reduced where it
    // lies, else undefined (Note [Gradients in place] in reducer.cpp).
    std::vector<at::Tensor> in_place;
  };

  // Where an iteration is. kArmed: forward ran, no gradient yet; kReducing:
  // some gradients ready, buckets being launched; kFinalizing: all launched,
  // finalize queued; kRecording: first static_graph backward, hooks only
  // counted, the delayed reduction queued.
  enum class State { kIdle, kArmed, kRecording, kReducing, kFinalizing };

  void autograd_hook(size_t index);
  void mark_variable_ready(size_t index);
  void launch_ready_buckets();
  void launch_bucket(size_t bucket_index, const at::Tensor& buffer);
  // Note [Gradients in place]: whether variable `index`'s `grad` is
  // reduced where it lies, and the gradients of `bucket` that are, for
  // ProcessGroup::reduce_gradients of `buffer`.
  bool takes_in_place(const Bucket& bucket, size_t index, const at::Tensor& grad) const;
  std::vector<ReduceTarget> gradients_in_place(const Bucket& bucket, const at::Tensor& buffer) const;
  std::vector<GradientSpec> gradient_specs() const;
  void write_sparse_gradient(size_t index, const at::Tensor& reduced); // sparse_gradients.cpp
  // reducer_insight.cpp. `finalize_start`: when finalize began waiting for
  // the buckets.
  void record_insight(double comm_wait_ms, std::chrono::steady_clock::time_point finalize_start);
  // The iteration's events on the timeline (Note [Timeline]). reducer_insight.cpp, as the above.
  void trace_iteration(std::chrono::steady_clock::time_point finalize_start);
  size_t bucket_bytes(const Bucket& bucket) const;
  void finalize_backward();
  void finalize_backward_guarded(); // mutex_ held
  void finalize_backward_locked();                                       // reducer_finalize.cpp
  // Waits for bucket `b`'s Work and checks its result; returns the ms
  // spent waiting. reducer_finalize.cpp.
  double wait_for_bucket(size_t b);
  // Writes bucket `b`'s reduced gradients back (skipping the parameters
  // that `usage`, when defined, says no rank used), then calls the bucket
  // reduced hook. reducer_finalize.cpp.
  void write_back_bucket(size_t b, const at::Tensor& usage);
  // Whether buckets are finished while later ones are still being filled.
  bool finishes_early() const;                                          // reducer_finalize.cpp
  void delayed_reduction();
  void queue_delayed_reduction_locked();
  void queue_finalize();
  bool reduces_usage() const;
  // Whether dense gradients are divided by the world size as they are
  // copied into their bucket (Note [Built-in allreduce]).
  bool divides_on_copy() const;
  // What the built-in allreduce divides by: set_divisor's, or the world size.
  double divisor() const;
  // Copies `grad` into its bucket view, dividing on the way when
  // divides_on_copy().
  void copy_into_view(const at::Tensor& grad, at::Tensor& view);
  void check_static_graph_hook(size_t index);
  std::string unfinished_reduction_message() const;
  void initialize_buckets(const std::vector<std::vector<size_t>>& assignment);
  // Gives a dense bucket its buffer and views; `collective`: through the
  // group's allocate_collective_buffer (every rank at the same point).
  void allocate_bucket(Bucket& bucket, bool collective);
  // Whether dense buckets are released after they are written back and
  // allocated again at their first gradient: Note [Released buckets].
  bool releases_buckets() const;
  // Whether this rank keeps `param`'s reduced gradient (the consumer's
  // keeper).
  bool keeps_gradient(const at::Tensor& param) const;
  void release_bucket(Bucket& bucket);
  void rebuild_buckets_if_due();
  void install_hook(size_t index, AutogradNodePtr accumulator);
  void rehook_replaced_parameters();
  void reset_iteration();
  std::string who() const;
  std::string names_of(const std::vector<size_t>& indices) const;

  const std::vector<at::Tensor> parameters_;
  const std::vector<std::string> names_;
  const std::shared_ptr<ProcessGroup> group_;
  const ReducerConfig config_;
  const c10::Device device_; // where the parameters, and our control tensors, live

  // Gradient accumulators are held only weakly by their parameters: keep
  // them alive so that the hooks stay installed.
  std::vector<AutogradNodePtr> grad_accumulators_;
  std::vector<uintptr_t> hook_keys_;

  mutable std::mutex mutex_;
  CommHook comm_hook_;                    // guarded by mutex_
  BucketConsumer consumer_;               // guarded by mutex_
  size_t next_finished_ = 0;              // buckets finished this iteration; guarded by mutex_
  // Buckets launched and not yet finished that may remain when the next is
  // launched, with a bucket reduced hook: Note [Bucket reduced hook].
  static constexpr size_t kUnfinishedAtLaunch = 1;
  double early_comm_wait_ms_ = 0;         // spent waiting in finish_bucket so far; guarded by mutex_
  // No hook registered: see Note [Built-in allreduce]. Guarded by mutex_.
  bool builtin_hook_ = true;
  std::vector<Bucket> buckets_;           // guarded by mutex_
  std::vector<VariableLocator> locators_; // guarded by mutex_
  State state_ = State::kIdle;            // guarded by mutex_
  bool require_sync_ = true;              // guarded by mutex_
  int64_t iteration_ = 0;                 // synchronised iterations finished
  bool buckets_rebuilt_ = false;
  std::vector<bool> ready_;               // per variable, this iteration
  std::vector<bool> used_since_sync_;     // per variable: got a gradient
  std::vector<size_t> unused_;            // from the graph walk
  std::vector<size_t> ready_order_;       // first iteration, for rebuilding
  size_t next_bucket_ = 0;
  at::Tensor usage_;                      // int32 per variable, allreduced in place: after
                                          // a synchronised step, that step's sums over ranks
  std::shared_ptr<Work> usage_work_;
  bool shadowing_ = false;
  int divisor_ = 0; // set_divisor's; 0: the world size

  // static_graph (Note [Delayed reduction]); all guarded by mutex_.
  size_t hooks_seen_ = 0;                // this iteration, for the ready order
  std::vector<size_t> hook_counts_;      // per variable: hooks per iteration, from the first
  std::vector<size_t> last_hook_;        // first iteration: hooks_seen_ at its last hook
  std::vector<size_t> hooks_remaining_;  // this iteration
  std::vector<size_t> static_unused_;    // hook count 0 on this rank
  at::Tensor static_usage_;              // the first iteration's usage sums over ranks (CPU)

  // Insight (reducer_insight.cpp); guarded by mutex_.
  IterationTimer timer_;
  IterationInsight insight_;
};

// The gradient of a rank that has none for a sparse variable `param`
// (sparse_gradients.cpp).
at::Tensor empty_sparse_gradient(const at::Tensor& param);

} // namespace ddp::internal
