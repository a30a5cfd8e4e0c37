#pragma once

// The flight recorder (private header): per process group, a ring of the
// last collectives with their state and times, written to a JSON file per
// rank when something fails. See Note [Flight recorder] in
// flight_recorder.cpp, and docs/debugging.md for the file's schema.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/fingerprint.h"

namespace ddp::internal {

// The live recorders of the process (flight_recorder.cpp). Every recorder
// holds it, so that a group destroyed at exit, after the static one is
// gone, can still write its dump.
struct FlightRecorderRegistry;
class CollectiveListener;

class FlightRecorder {
 public:
  enum class State : uint8_t { kQueued, kStarted, kCompleted, kFailed };

  struct Entry {
    uint64_t id = 0; // the group's record number, from 0
    uint64_t seq = 0;
    std::string op;
    std::string shape; // Fingerprint::shape(): "float32[1000] SUM"
    std::string dtype; // "" for none
    int64_t numel = 0;
    std::string reduce; // "" for none
    int root = -1;
    std::string label; // who issued it (comm/collective_label.h), or ""
    State state = State::kQueued;
    int64_t queued_us = 0; // microseconds since the Unix epoch
    int64_t started_us = 0;
    int64_t completed_us = 0;
    std::string error;
  };

  // The recorder of one process group, registered for dumps; nullptr when
  // DDP_FLIGHT_RECORDER_SIZE is 0. `group` names it ("default", a
  // subgroup's name), `backend` is the group's. `listener`, when given,
  // learns of every collective that ends. Backends create theirs through
  // make_flight_recorder (comm/recorder_outputs.h), which adds the
  // timeline.
  static std::shared_ptr<FlightRecorder> create(std::string group, std::string backend, int rank, int size,
                                                std::shared_ptr<CollectiveListener> listener = nullptr);

  FlightRecorder(std::string group, std::string backend, int rank, int size, size_t capacity,
                 std::shared_ptr<FlightRecorderRegistry> registry, std::shared_ptr<CollectiveListener> listener);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // A collective was issued; returns its record id for the calls below.
  uint64_t queued(const Fingerprint& fingerprint);
  void started(uint64_t id);
  void completed(uint64_t id);
  // With `dump`, also writes this process's dump (dump_flight_recorders)
  // before returning: the failure itself, not the tasks it leaves unrun.
  void failed(uint64_t id, const std::string& error, bool dump = true);
  // The same with the exception's message.
  void failed(uint64_t id, const std::exception_ptr& error, bool dump = true);

  // This group's ring, oldest first.
  std::vector<Entry> entries() const;
  const std::string& group() const {
    return group_;
  }
  const std::string& backend() const {
    return backend_;
  }
  int rank() const {
    return rank_;
  }
  int size() const {
    return size_;
  }

 private:
  void update(uint64_t id, State state, const std::string* error);

  const std::string group_;
  const std::string backend_;
  const int rank_;
  const int size_;
  const size_t capacity_;
  const std::shared_ptr<FlightRecorderRegistry> registry_;
  const std::shared_ptr<CollectiveListener> listener_; // or nullptr
  mutable std::mutex mutex_;
  std::vector<Entry> ring_; // guarded by mutex_; entry id sits at id % capacity_
  uint64_t next_id_ = 0;    // guarded by mutex_
};

// What learns of each collective that a recorder sees end, besides its
// ring: the timeline, through comm/recorder_outputs.cpp. The recorder
// knows no output but its dump.
class CollectiveListener {
 public:
  virtual ~CollectiveListener() = default;
  // Completed or failed; called outside the recorder's lock, on the thread
  // that ended it.
  virtual void ended(const FlightRecorder::Entry& entry) = 0;
};

// "queued", "started", "completed", "failed": as the dump writes them.
const char* to_string(FlightRecorder::State state);

// What a dump request (SIGUSR1) writes besides the recorders' dump: one
// callback for the process (the timeline's write), replacing an earlier
// one; empty for none. Runs on the recorders' signal thread.
void on_dump_request(std::function<void()> also);

// Writes every live group's ring of this process to
// <DDP_FLIGHT_RECORDER_DIR>/rank_<R>.json (R: the rank of the first group
// this process made, its world rank), replacing an earlier dump atomically.
// Returns the file's path, or "" when the recorder is off or the file could
// not be written (then a warning says why). Never throws.
std::string dump_flight_recorders(const std::string& reason);

// The JSON text of such a dump.
std::string flight_recorder_json(const std::string& reason);

} // namespace ddp::internal
