#pragma once

/// The timeline: with DDP_TRACE_DIR set, each rank keeps the events of its
/// last steps (DDP_TRACE_STEPS, default 20): DistributedDataParallel's
/// forward, backward, buckets and waits, FullyShardedDataParallel's forward
/// (each forward with gradients of either begins a step), every collective, the
/// ZeroRedundancyOptimizer's step and the spans a program marks with
/// TimelineScope. At exit it writes them to DDP_TRACE_DIR/trace_rank_<R>.json
/// in the Chrome Trace Event Format (Perfetto, chrome://tracing);
/// `ddprun --trace DIR` merges the ranks into DIR/trace.json and draws
/// DIR/trace.svg. See docs/debugging.md, "A timeline of each step".

#include <cstdint>
#include <string>

namespace ddp {

/// Whether this process keeps a timeline (DDP_TRACE_DIR is set and not empty).
bool timeline_enabled();

/// Marks the span from its construction to its destruction on the timeline,
/// on the track `track` (created on first use; "optimizer" is the
/// optimizer's track): e.g. around `optimizer.step()`. Costs nothing when the
/// timeline is off.
///
/// Example:
///   { ddp::TimelineScope scope("optimizer step", "optimizer"); optimizer.step(); }
///
/// Thread-safety: any thread may hold scopes, each its own (the timeline
/// records from every thread under one lock); one scope belongs to the
/// thread that made it.
class TimelineScope {
 public:
  explicit TimelineScope(std::string name, const std::string& track = "user");
  ~TimelineScope();
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  std::string name_;
  int track_ = 0; // 0: the timeline is off
  int64_t start_us_ = 0;
};

/// Writes this process's timeline now (it is also written at exit); returns
/// the file's path, or an empty string when the timeline is off, no process
/// group exists yet, or the file could not be written (a warning says why).
/// Never throws.
std::string write_timeline();

} // namespace ddp
