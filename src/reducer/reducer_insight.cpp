// The Reducer's insight: what an iteration's timing looked like (forward,
// backward, each bucket's launch and completion, the overlap) and the
// bucket layout, for DistributedDataParallel::last_iteration_insight(),
// bucket_layout() and DDP_DEBUG=1. Apart from the reduction itself, which
// only records the events these figures are computed from (reducer_timer.h).

#include "reducer/reducer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "internal/logging.h"
#include "timeline/timeline.h"

namespace ddp::internal {

using Event = IterationTimer::Event;

// Called by finalize_backward_locked with mutex_ held, once every bucket is
// reduced; `comm_wait_ms` is how long it waited for them.
void Reducer::record_insight(double comm_wait_ms, std::chrono::steady_clock::time_point finalize_start) {
  IterationInsight insight;
  insight.iteration = iteration_ + 1;
  insight.forward_ms = timer_.ms_between(Event::kForwardStart, Event::kForwardEnd);
  insight.backward_compute_ms = timer_.ms_between(Event::kBackwardStart, Event::kBackwardEnd);
  insight.comm_wait_ms = comm_wait_ms;
  double overlapped = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    BucketInsight info;
    info.index = b;
    info.parameter_names = *bucket.parameter_names;
    info.dtype = c10::toString(parameters_[bucket.variable_indices.front()].scalar_type());
    info.bytes = bucket_bytes(bucket);
    info.sparse = bucket.sparse;
    info.launch_ms = bucket.launch_ms;
    info.done_ms = bucket.work ? timer_.ms_since(Event::kBackwardStart, bucket.work->completion_time())
                               : bucket.done_ms;
    insight.comm_ms += info.done_ms - info.launch_ms;
    overlapped += std::max(0.0, std::min(info.done_ms, insight.backward_compute_ms) - info.launch_ms);
    insight.buckets.push_back(std::move(info));
  }
  insight.overlap_fraction = insight.comm_ms > 0 ? overlapped / insight.comm_ms : 0;
  insight.first_bucket_started_before_backward_end =
      !buckets_.empty() && buckets_[0].launch_ms < insight.backward_compute_ms;
  insight_ = std::move(insight);
  if (config_.print_insight && group_->rank() == 0) {
    log_info(insight_.to_string());
  }
  trace_iteration(finalize_start);
}

// The same figures as events (Note [Timeline]), from the same times: the
// backward window, each bucket from launch to completion, and finalize's wait.
void Reducer::trace_iteration(std::chrono::steady_clock::time_point finalize_start) {
  Timeline* timeline = Timeline::get();
  const auto& backward_start = timer_.at(Event::kBackwardStart);
  if (timeline == nullptr || !backward_start) {
    return;
  }
  const int64_t origin = timeline->us_of(*backward_start);
  const auto at_ms = [origin](double ms) { return origin + static_cast<int64_t>(ms * 1000.0 + 0.5); };
  timeline->complete(Timeline::kStepTrack, "backward", origin, at_ms(insight_.backward_compute_ms),
                     TimelineArgs()
                         .add("iteration", insight_.iteration)
                         .add("buckets", static_cast<int64_t>(buckets_.size()))
                         .take());
  for (const BucketInsight& bucket : insight_.buckets) {
    const auto index = static_cast<int64_t>(bucket.index);
    const std::string name = "bucket " + std::to_string(index);
    const double ready_ms = buckets_[bucket.index].ready_ms;
    timeline->instant(Timeline::kBucketTrack, name + " ready", at_ms(ready_ms),
                      TimelineArgs().add("bucket", index).take());
    timeline->complete(Timeline::kBucketTrack, name, at_ms(bucket.launch_ms), at_ms(bucket.done_ms),
                       TimelineArgs()
                           .add("bucket", index)
                           .add("iteration", insight_.iteration)
                           .add("bytes", static_cast<int64_t>(bucket.bytes))
                           .add("parameters", static_cast<int64_t>(bucket.parameter_names.size()))
                           .add("ready_ms", ready_ms)
                           .take());
  }
  timeline->complete(Timeline::kStepTrack, "wait for buckets", timeline->us_of(finalize_start),
                     Timeline::now_us(), TimelineArgs().add("waited_ms", insight_.comm_wait_ms).take());
}

void Reducer::record_forward_event(Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  timer_.record(event);
}

IterationInsight Reducer::last_insight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return insight_;
}

std::vector<BucketInsight> Reducer::layout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BucketInsight> layout;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketInsight info;
    info.index = b;
    info.parameter_names = *buckets_[b].parameter_names;
    info.dtype = c10::toString(parameters_[buckets_[b].variable_indices.front()].scalar_type());
    info.bytes = bucket_bytes(buckets_[b]);
    info.sparse = buckets_[b].sparse;
    layout.push_back(std::move(info));
  }
  return layout;
}

} // namespace ddp::internal
