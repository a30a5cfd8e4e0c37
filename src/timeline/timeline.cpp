// Note [Timeline]
// With DDP_TRACE_DIR set, each rank keeps the events of its last steps and
// writes them, when the program exits, as a Chrome Trace Event Format file,
// <DDP_TRACE_DIR>/trace_rank_<R>.json, which Perfetto and chrome://tracing
// open; `ddprun --trace DIR` also merges the ranks' files into one, with a
// picture (src/launch/readers/trace_merge.cpp).
//
// A step begins at each DistributedDataParallel or FullyShardedDataParallel
// forward with gradients.
// What fills it, on its track (a "thread" of the rank's "process"):
//   "DDP step"   forward, backward (from the first gradient ready to the
//                last: the window in which communication can overlap), and
//                the wait for the buckets at the end of backward;
//   "buckets"    each bucket from its launch to its reduction's completion,
//                with the moment it became ready;
//   "waits"      every Work::wait that blocked, named by the work;
//   "optimizer"  the ZeroRedundancyOptimizer's step, and any
//                ddp::TimelineScope the program opens there;
//   one track per process group, "collectives: <group> (<backend>)": each
//                collective from its start to its completion, with its
//                sequence number, shape and time in the queue. These come
//                from the flight recorder, as its listener
//                (comm/recorder_outputs.cpp joins the two, which know
//                nothing of each other); DDP_FLIGHT_RECORDER_SIZE=0 turns
//                the recorder off, and them with it.
// The DDP events are the ones last_iteration_insight() is computed from, so
// the trace and the insight agree.
//
// Bounded: the last DDP_TRACE_STEPS steps (default 20; a ring), or the
// steps A to B; at most kMaxEventsPerStep events a step (more are counted
// in the file, not kept). Cheap: an event is a lock and a few strings, a
// handful per bucket and collective, next to the milliseconds a step takes
// (bench/flight_recorder_bench measures it); nothing at all when off.
//
// Chrome's format wants the complete ("X") events of one thread to nest;
// the buckets' and collectives' spans can overlap (a bucket launched while
// the previous one is still reduced), so the writer spreads each track over
// as many lanes ("buckets", "buckets #2", ...) as its overlaps need.

#include "timeline/timeline.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"
#include "internal/text_files.h"

#include <ddp/comm/error.h>
#include <ddp/timeline.h>

namespace ddp::internal {

namespace {

constexpr int64_t kMaxEventsPerStep = 20000;
constexpr int64_t kMaxKeepLast = 100000;
// Lanes of one track are thread ids track * kLanes + lane.
constexpr int kLanes = 1000;

std::shared_ptr<Timeline> from_env() {
  const auto directory = env_get(kEnvTraceDir);
  if (!directory || directory->empty()) {
    return nullptr;
  }
  int64_t keep_last = 0;
  int64_t first = 1;
  int64_t last = 0;
  parse_trace_steps(env_get(kEnvTraceSteps).value_or(kEnvTraceSteps.default_value), keep_last, first, last);
  return std::make_shared<Timeline>(*directory, keep_last, first, last);
}

int64_t steady_us(std::chrono::steady_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::microseconds>(when.time_since_epoch()).count();
}

} // namespace

void parse_trace_steps(const std::string& text, int64_t& keep_last, int64_t& first, int64_t& last) {
  const auto number = [&](const std::string& part, int64_t& out) {
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || part[0] == '-' || part[0] == '+' || *end != '\0' || errno != 0 || value < 1) {
      return false;
    }
    out = value;
    return true;
  };
  const size_t dash = text.find('-');
  bool good = false;
  if (dash == std::string::npos) {
    good = number(text, keep_last) && keep_last <= kMaxKeepLast;
  } else {
    keep_last = 0;
    good = number(text.substr(0, dash), first) && number(text.substr(dash + 1), last) && first <= last;
  }
  DDP_CHECK(good, kEnvTraceSteps.name, " must be K (the last K steps, 1 to ", kMaxKeepLast,
            ") or A-B (steps A to B, 1 <= A <= B), got '", text, "'");
}

void TimelineArgs::key(const char* name) {
  if (!text_.empty()) {
    text_ += ", ";
  }
  text_ += '"';
  text_ += name;
  text_ += "\": ";
}

TimelineArgs& TimelineArgs::add(const char* name, int64_t value) {
  key(name);
  text_ += std::to_string(value);
  return *this;
}

TimelineArgs& TimelineArgs::add(const char* name, double value) {
  key(name);
  char number[32];
  std::snprintf(number, sizeof(number), "%.4f", value);
  text_ += number;
  return *this;
}

TimelineArgs& TimelineArgs::add(const char* name, const std::string& value) {
  key(name);
  append_json_string(text_, value);
  return *this;
}

std::shared_ptr<Timeline> Timeline::shared() {
  // A failed parse throws before the static is set, and the next call
  // throws again: every group of a misconfigured process fails alike.
  static const std::shared_ptr<Timeline> instance = from_env();
  return instance;
}

Timeline* Timeline::get() {
  static Timeline* const instance = shared().get();
  return instance;
}

int64_t Timeline::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t Timeline::us_of(std::chrono::steady_clock::time_point when) const {
  return steady_us(when) + steady_to_epoch_us_;
}

Timeline::Timeline(std::string directory, int64_t keep_last, int64_t first_step, int64_t last_step)
    : directory_(std::move(directory)),
      keep_last_(keep_last),
      first_step_(first_step),
      last_step_(last_step),
      steady_to_epoch_us_(now_us() - steady_us(std::chrono::steady_clock::now())),
      track_names_{"DDP step", "buckets", "waits", "optimizer"} {
  steps_.emplace_back(); // step 0: what happens before the first forward
}

Timeline::~Timeline() {
  write();
}

void Timeline::set_rank(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank_ < 0) {
    rank_ = rank;
    world_size_ = world_size;
  }
}

int Timeline::track(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = std::find(track_names_.begin(), track_names_.end(), name);
  if (found != track_names_.end()) {
    return static_cast<int>(found - track_names_.begin()) + 1;
  }
  track_names_.push_back(name);
  return static_cast<int>(track_names_.size());
}

bool Timeline::keeps(int64_t step) const {
  return keep_last_ > 0 || (step >= first_step_ && step <= last_step_);
}

int64_t Timeline::begin_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++step_;
  if (keep_last_ > 0) {
    if (static_cast<int64_t>(steps_.size()) >= keep_last_) {
      steps_.pop_front();
    }
    steps_.push_back(Step{step_, {}, 0});
  } else if (keeps(step_)) {
    if (!steps_.empty() && steps_.front().number == 0) {
      steps_.pop_front(); // a range starts at a step, not before the first
    }
    steps_.push_back(Step{step_, {}, 0});
  }
  return step_;
}

void Timeline::add(Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (steps_.empty() || steps_.back().number != step_) {
    return; // a step outside the range
  }
  Step& step = steps_.back();
  if (static_cast<int64_t>(step.events.size()) >= kMaxEventsPerStep) {
    ++step.dropped;
    return;
  }
  event.step = step_;
  step.events.push_back(std::move(event));
}

void Timeline::complete(int track, std::string name, int64_t start_us, int64_t end_us, std::string args) {
  add(Event{std::move(name), std::move(args), start_us, std::max<int64_t>(0, end_us - start_us), track, 0});
}

void Timeline::instant(int track, std::string name, int64_t at_us, std::string args) {
  add(Event{std::move(name), std::move(args), at_us, -1, track, 0});
}

std::string Timeline::json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int pid = std::max(rank_, 0);
  // Each track's spans spread over lanes so that none overlaps another of
  // its lane (see the Note): lane_ends[track][lane] is where that lane is free.
  std::vector<const Event*> events;
  int64_t dropped = 0;
  for (const Step& step : steps_) {
    dropped += step.dropped;
    for (const Event& event : step.events) {
      events.push_back(&event);
    }
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event* a, const Event* b) { return a->ts_us < b->ts_us; });
  std::map<int, std::vector<int64_t>> lane_ends;
  std::map<int, int> lanes_used; // tid -> track
  std::string body;
  for (const Event* event : events) {
    auto& ends = lane_ends[event->track];
    size_t lane = 0;
    if (event->dur_us >= 0) {
      while (lane < ends.size() && ends[lane] > event->ts_us) {
        ++lane;
      }
      if (lane == ends.size()) {
        ends.push_back(0);
      }
      ends[lane] = event->ts_us + event->dur_us;
    }
    const int tid = event->track * kLanes + static_cast<int>(std::min<size_t>(lane, kLanes - 1));
    lanes_used[tid] = event->track;
    body += ",\n{\"name\": ";
    append_json_string(body, event->name);
    body += c10::str(", \"ph\": \"", event->dur_us >= 0 ? "X" : "i", "\", \"ts\": ", event->ts_us);
    if (event->dur_us >= 0) {
      body += c10::str(", \"dur\": ", event->dur_us);
    } else {
      body += ", \"s\": \"t\"";
    }
    body += c10::str(", \"pid\": ", pid, ", \"tid\": ", tid, ", \"args\": {\"step\": ", event->step);
    if (!event->args.empty()) {
      body += ", " + event->args;
    }
    body += "}}";
  }
  std::string out = "{\"traceEvents\": [\n";
  out += c10::str("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", pid,
                  ", \"tid\": 0, \"args\": {\"name\": \"rank ", pid, "\"}},\n");
  out += c10::str("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": ", pid,
                  ", \"tid\": 0, \"args\": {\"sort_index\": ", pid, "}}");
  for (const auto& [tid, track] : lanes_used) {
    const int lane = tid % kLanes;
    std::string name = track_names_[track - 1];
    if (lane > 0) {
      name += c10::str(" #", lane + 1);
    }
    out += c10::str(",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": ", pid, ", \"tid\": ", tid,
                    ", \"args\": {\"name\": ");
    append_json_string(out, name);
    out += c10::str("}},\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": ", pid,
                    ", \"tid\": ", tid, ", \"args\": {\"sort_index\": ", tid, "}}");
  }
  out += body;
  out += "\n],\n\"displayTimeUnit\": \"ms\",\n";
  out += c10::str("\"otherData\": {\"schema\": \"ddp-timeline\", \"version\": 1, \"rank\": ", rank_,
                  ", \"world_size\": ", world_size_, ", \"steps\": \"");
  out += keep_last_ > 0 ? c10::str("last ", keep_last_) : c10::str(first_step_, "-", last_step_);
  out += c10::str("\", \"first_step\": ", steps_.empty() ? 0 : steps_.front().number,
                  ", \"last_step\": ", steps_.empty() ? 0 : steps_.back().number,
                  ", \"dropped_events\": ", dropped, "}\n}\n");
  return out;
}

std::string Timeline::write() noexcept {
  int rank = -1;
  try {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      rank = rank_;
    }
    if (rank < 0) {
      return ""; // no group was made: nothing to name the file by
    }
    const std::string path = c10::str(directory_, "/trace_rank_", rank, ".json");
    const std::string problem = replace_file(path, json());
    if (!problem.empty()) {
      log_warning(c10::str("[rank ", rank, "] timeline: could not write its trace (", problem, "); set ",
                           kEnvTraceDir.name, " to a writable directory"));
      return "";
    }
    return path;
  } catch (const std::exception& e) {
    log_warning(c10::str("[rank ", rank, "] timeline: could not write its trace: ", error_message(e)));
  } catch (...) {
  }
  return "";
}

} // namespace ddp::internal

namespace ddp {

bool timeline_enabled() {
  return internal::Timeline::get() != nullptr;
}

TimelineScope::TimelineScope(std::string name, const std::string& track) : name_(std::move(name)) {
  if (auto* timeline = internal::Timeline::get()) {
    track_ = timeline->track(track);
    start_us_ = internal::Timeline::now_us();
  }
}

TimelineScope::~TimelineScope() {
  if (track_ != 0) {
    internal::Timeline::get()->complete(track_, std::move(name_), start_us_, internal::Timeline::now_us());
  }
}

std::string write_timeline() {
  try {
    auto* timeline = internal::Timeline::get();
    return timeline != nullptr ? timeline->write() : "";
  } catch (...) {
    return ""; // a malformed DDP_TRACE_STEPS: the first group said so
  }
}

} // namespace ddp
