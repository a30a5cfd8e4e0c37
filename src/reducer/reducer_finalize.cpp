// The end of a synchronised backward: each bucket's reduced gradients are
// written back into the parameters' `.grad` as soon as its Work completes,
// in bucket order, while the later buckets are still on the wire (as
// PyTorch's finalize_backward).
//
// Note [Bucket reduced hook]
// A bucket reduced hook (the BucketConsumer's on_reduced: an optimizer
// stepping during backward) runs after each bucket is written back. With one registered, and when no
// usage map has to be reduced first (find_unused_parameters off, or a
// static graph past its first iteration), bucket b - 2 is finished just
// before bucket b is launched (kUnfinishedAtLaunch buckets stay in flight),
// during backward: the hook's own collectives (an optimizer's broadcasts of
// what it stepped) then
// come between the gradient allreduces at the same place on every rank,
// whatever the timing, and the work they start runs while backward computes
// bucket b. The cost is that backward waits there for bucket b - 2's
// reduction, which has had the time that buckets b - 1 and b took to fill
// (with a wait for bucket b - 1 instead, Gloo's overlapped sharded optimizer
// step measured 1.16x DDP's; with b - 2, about 1.0x: docs/benchmarks.md). The remaining
// buckets are finished in the final callback, as without a hook.
//
// Note [Released buckets]
// With a keeper per parameter (sharded gradients: a rank keeps only the
// reduced gradients of the parameters it keeps), a dense bucket holds memory only
// while it is in use: from the first gradient copied into it in a backward
// until it is written back, when its buffer and views are dropped; the next
// backward allocates it again (at::empty: every element is written before
// the bucket is launched), its gradients grouped by keeper in rank order, so
// that each keeper's are one contiguous range that a reduce-scatter can send
// without a copy. Every parameter loses its `.grad` as soon as the gradient
// is copied into the bucket (the bucket holds it now), and one this rank
// keeps gets its reduced gradient back at write-back as a tensor of its own,
// never a view that would keep the whole bucket alive
// (gradient_as_bucket_view is set aside). Gradient
// memory per rank is then the owned gradients, about 1/N, plus the buckets
// being filled or reduced; without it, every bucket stays allocated, the
// size of all the gradients again. The buffers are plain tensors, not the
// group's allocate_collective_buffer, whose shared memory serves only the
// built-in allreduce, which sharded gradients do not use (the consumer's
// comm hook reduce-scatters).

#include "reducer/reducer.h"

#include <ATen/ATen.h>

#include <chrono>

#include "internal/check.h"

namespace ddp::internal {

namespace {
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point from) {
  return std::chrono::duration<double, std::milli>(Clock::now() - from).count();
}
} // namespace

void Reducer::set_bucket_consumer(BucketConsumer consumer) {
  std::lock_guard<std::mutex> lock(mutex_);
  DDP_CHECK(state_ == State::kIdle, who(),
            ": a bucket reduced hook can only be set between iterations, not during backward");
  consumer_ = std::move(consumer);
  if (releases_buckets()) {
    for (auto& bucket : buckets_) {
      release_bucket(bucket);
    }
  }
}

bool Reducer::releases_buckets() const {
  return static_cast<bool>(consumer_.keeper);
}

bool Reducer::keeps_gradient(const at::Tensor& param) const {
  const int keeper = consumer_.keeper(param);
  return keeper < 0 || keeper == group_->rank();
}

void Reducer::release_bucket(Bucket& bucket) {
  if (!bucket.sparse) {
    bucket.buffer = at::Tensor();
    bucket.views.clear();
  }
}

bool Reducer::has_bucket_consumer() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<bool>(consumer_.on_reduced);
}

bool Reducer::finishes_early() const {
  return consumer_.on_reduced && !reduces_usage() && !shadowing_;
}

double Reducer::wait_for_bucket(size_t b) {
  Bucket& bucket = buckets_[b];
  const auto start = Clock::now();
  bucket.work->wait();
  const double waited = ms_since(start);
  const auto& result = bucket.work->result();
  DDP_CHECK(!result.empty() && result[0].defined() && result[0].numel() == bucket.buffer.numel(),
            who(), ": the communication hook's result for bucket ", b, " has ",
            result.empty() || !result[0].defined() ? 0 : result[0].numel(),
            " elements, expected ", bucket.buffer.numel());
  if (bucket.sparse) {
    bucket.buffer = result[0]; // written back below
    bucket.sparse_bytes = result[0].is_sparse()
        ? static_cast<size_t>(result[0]._indices().nbytes() + result[0]._values().nbytes())
        : static_cast<size_t>(result[0].nbytes());
  } else if (!result[0].is_same(bucket.buffer)) {
    bucket.buffer.copy_(result[0].reshape({-1}));
  }
  return waited;
}

void Reducer::write_back_bucket(size_t b, const at::Tensor& usage) {
  Bucket& bucket = buckets_[b];
  for (size_t k = 0; k < bucket.variable_indices.size(); ++k) {
    const size_t index = bucket.variable_indices[k];
    if (usage.defined() && usage.data_ptr<int>()[index] == 0) {
      continue; // unused on every rank: its gradient stays as it was
    }
    if (bucket.sparse) {
      write_sparse_gradient(index, bucket.buffer);
      continue;
    }
    const at::Tensor& view = bucket.views[k];
    auto& param = const_cast<at::Tensor&>(parameters_[index]);
    at::Tensor& grad = param.mutable_grad();
    const bool release = releases_buckets() && !shadowing_;
    if (release && !keeps_gradient(param)) {
      grad = at::Tensor();
      continue;
    }
    const at::Tensor target = k < bucket.in_place.size() ? bucket.in_place[k] : at::Tensor();
    if (target.defined()) {
      // Note [Gradients in place] in reducer.cpp: the result is in it.
      if (grad.is_same(target)) {
        grad.unsafeGetTensorImpl()->bump_version();
      } else if (grad.defined()) {
        grad.copy_(target); // replaced meanwhile
      } else {
        grad = target.clone();
      }
    } else if (config_.gradient_as_bucket_view && !release) {
      if (!grad.defined() || !grad.is_alias_of(view)) {
        grad = view;
      }
    } else if (grad.defined() && !grad.is_alias_of(view)) {
      grad.copy_(view);
    } else {
      grad = view.clone();
    }
  }
  bucket.in_place.clear();
  if (releases_buckets() && !shadowing_) {
    // The Work's result holds the buffer: keep only its completion time.
    bucket.done_ms = timer_.ms_since(IterationTimer::Event::kBackwardStart, bucket.work->completion_time());
    bucket.work.reset();
    release_bucket(bucket);
  }
  if (consumer_.on_reduced && !shadowing_) {
    std::vector<at::Tensor> parameters;
    parameters.reserve(bucket.variable_indices.size());
    for (const size_t index : bucket.variable_indices) {
      parameters.push_back(parameters_[index]);
    }
    consumer_.on_reduced(b, parameters);
  }
}

void Reducer::finalize_backward_locked() {
  DDP_INTERNAL_ASSERT(state_ == State::kFinalizing);
  const auto finalize_start = Clock::now();
  // Each bucket is written back as soon as it is reduced, unless the usage
  // map, reduced after the last bucket, must be known first.
  double comm_wait_ms = early_comm_wait_ms_;
  at::Tensor global_usage;
  bool usage_known = false;
  const auto know_usage = [&] {
    if (usage_known) {
      return;
    }
    usage_known = true;
    if (usage_work_) {
      const auto start = Clock::now();
      usage_work_->wait();
      comm_wait_ms += ms_since(start);
      global_usage = usage_.cpu();
      if (config_.static_graph) {
        static_usage_ = global_usage.clone(); // Note [Delayed reduction]: for good
      }
    } else if (config_.static_graph && static_usage_.defined()) {
      global_usage = static_usage_;
    }
  };
  for (; next_finished_ < buckets_.size(); ++next_finished_) {
    comm_wait_ms += wait_for_bucket(next_finished_);
    know_usage();
    write_back_bucket(next_finished_, global_usage);
  }
  know_usage(); // no buckets: the usage map is still reduced

  record_insight(comm_wait_ms, finalize_start);

  ++iteration_;
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), false);
  reset_iteration();
}

} // namespace ddp::internal
