#pragma once

// The timeline (private header): the events of each rank's last steps,
// written as a Chrome Trace Event Format file. See Note [Timeline] in
// timeline.cpp, and docs/debugging.md for the file and its tracks.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp::internal {

class Timeline {
 public:
  // The tracks every timeline has, in this order (thread ids 1 to 4); a
  // group's collectives and a user's TimelineScope names add their own.
  enum Track : int { kStepTrack = 1, kBucketTrack, kWaitTrack, kOptimizerTrack };

  // The process's timeline, or nullptr when DDP_TRACE_DIR is unset or empty.
  // Reads the environment on the first call; throws ddp::Error when
  // DDP_TRACE_STEPS is malformed (the first call is a process group's
  // construction, which then fails with that message).
  static Timeline* get();
  // The same, shared: what a process group keeps, so that a group destroyed
  // at exit still finds it.
  static std::shared_ptr<Timeline> shared();

  // Microseconds since the Unix epoch, the unit of every event's time (the
  // flight recorder's too).
  static int64_t now_us();
  // A steady-clock instant on that scale.
  int64_t us_of(std::chrono::steady_clock::time_point when) const;

  explicit Timeline(std::string directory, int64_t keep_last, int64_t first_step, int64_t last_step);
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  // Writes the file (the timeline lives until the last group holding it is
  // gone, at the latest at exit).
  ~Timeline();

  // The first group created names the file and the process (its rank in it,
  // the world rank); later calls are ignored.
  void set_rank(int rank, int world_size);
  // The track named `name`, created on first use.
  int track(const std::string& name);
  // A DistributedDataParallel or FullyShardedDataParallel forward with
  // gradients: a new step begins.
  // Returns its number (from 1).
  int64_t begin_step();

  // An event on `track` from `start_us` to `end_us`; `args` is the inside of
  // a JSON object ("\"bucket\": 3"), or empty. The current step's number is
  // added to it.
  void complete(int track, std::string name, int64_t start_us, int64_t end_us, std::string args = "");
  // A moment.
  void instant(int track, std::string name, int64_t at_us, std::string args = "");

  // Writes <directory>/trace_rank_<R>.json, replacing an earlier one; returns
  // its path, or "" when it could not (a warning says why). Never throws.
  std::string write() noexcept;
  // The file's text.
  std::string json() const;

 private:
  struct Event {
    std::string name;
    std::string args;
    int64_t ts_us = 0;
    int64_t dur_us = -1; // -1: a moment
    int track = 0;
    int64_t step = 0;
  };
  struct Step {
    int64_t number = 0;
    std::vector<Event> events;
    int64_t dropped = 0; // events over kMaxEventsPerStep
  };

  void add(Event event);
  bool keeps(int64_t step) const;

  const std::string directory_;
  const int64_t keep_last_;  // > 0: a ring of the last steps; 0: the range below
  const int64_t first_step_;
  const int64_t last_step_;
  const int64_t steady_to_epoch_us_;
  mutable std::mutex mutex_;
  int rank_ = -1; // guarded by mutex_, as everything below
  int world_size_ = 0;
  int64_t step_ = 0;
  std::deque<Step> steps_;
  std::vector<std::string> track_names_; // track t is track_names_[t - 1]
};

// An event's arguments, the inside of a JSON object, built without streams
// (an event costs a few of these appends: Note [Timeline]).
class TimelineArgs {
 public:
  TimelineArgs& add(const char* key, int64_t value);
  TimelineArgs& add(const char* key, double value); // 4 decimals
  TimelineArgs& add(const char* key, const std::string& value);
  std::string take() {
    return std::move(text_);
  }

 private:
  void key(const char* name);
  std::string text_;
};

// DDP_TRACE_STEPS's value: "K" (keep_last = K, the last K steps) or "A-B"
// (keep_last = 0, first = A, last = B). Throws ddp's error naming the
// variable and the value when it is neither.
void parse_trace_steps(const std::string& text, int64_t& keep_last, int64_t& first, int64_t& last);

} // namespace ddp::internal
