// Note [Flight recorder]
// Every process group keeps, always on, a ring of its last
// DDP_FLIGHT_RECORDER_SIZE collectives (default 2000; 0 turns it off): the
// group's sequence number, the operation and its shape, the state (queued,
// started, completed, failed), the times of each step and the error. A
// record costs a lock and a few strings per collective, next to the
// microseconds to seconds a collective takes (bench/flight_recorder_bench
// measures it).
//
// The process writes all of its groups' rings to one JSON file,
// <DDP_FLIGHT_RECORDER_DIR>/rank_<R>.json, whenever a collective fails (a
// timeout, a mismatch, a lost peer: the failing thread writes it before the
// error reaches the caller, so a rank that catches the error finds its dump
// written), on SIGUSR1 (when the program has not set its own handler;
// ddprun sends it to every rank before it tears a job down), and on
// ddp::dump_flight_recorder(). A dump replaces the previous one atomically
// (written aside, then renamed), so the file always holds the latest
// complete state. `ddprun --analyze DIR` reads the ranks' files together
// and names the rank at fault (src/launch/readers/analyzer.cpp).

#include "flight_recorder/flight_recorder.h"
#include "flight_recorder/dump_directory.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <ddp/comm/error.h>
#include <ddp/comm/flight_recorder.h>

#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"
#include "internal/text_files.h"

namespace ddp::internal {

namespace {

constexpr size_t kMaxCapacity = 1000000;
constexpr size_t kMaxErrorBytes = 1024; // per entry, so that a dump stays bounded

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

size_t capacity_from_env(int rank, int size, const std::string& backend) {
  const auto text = env_get(kEnvFlightRecorderSize).value_or("2000");
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  DDP_CHECK(!text.empty() && text[0] != '-' && *end == '\0' && errno == 0 && value <= kMaxCapacity, "[rank ",
            rank, "/", size, "] creating a ", backend, " process group: ", kEnvFlightRecorderSize.name, " must be a whole number of collectives in [0, ", kMaxCapacity,
            "] (0 turns the flight recorder off), got '", text, "'");
  return static_cast<size_t>(value);
}

} // namespace

// Every live recorder of the process, and the rank its dumps are named by.
struct FlightRecorderRegistry {
  std::mutex mutex;
  std::vector<std::weak_ptr<FlightRecorder>> recorders;
  int rank = -1; // the first group's rank
  int size = 0;  // and its size
  std::function<void()> also_on_request; // on_dump_request's
};

namespace {

using Registry = FlightRecorderRegistry;

// The dump's text, and writing it (defined below).
std::string json_of(Registry& r, const std::string& reason);
std::string dump_with(Registry& r, const std::string& reason);

// Shared by every recorder, which keeps it alive past this static's
// destruction at exit (a group destroyed then still dumps).
const std::shared_ptr<Registry>& registry() {
  static const auto instance = std::make_shared<Registry>();
  return instance;
}

int signal_pipe[2] = {-1, -1}; // set once, under the registry's mutex

void on_sigusr1(int) {
  const int fd = signal_pipe[1];
  if (fd >= 0) {
    const char byte = 1;
    ssize_t ignored = ::write(fd, &byte, 1); // async-signal-safe; a full pipe drops it
    (void)ignored;
  }
}

// Dumps on SIGUSR1, from a thread of its own: a signal handler may not
// allocate or take locks. Left alone when the program handles SIGUSR1
// itself.
void install_signal_dump_locked() {
  if (signal_pipe[0] >= 0) {
    return;
  }
  struct sigaction current {};
  if (::sigaction(SIGUSR1, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) {
    return;
  }
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return;
  }
  // The reader blocks; only the writer (the handler) must not.
  ::fcntl(signal_pipe[0], F_SETFL, 0);
  // What on_dump_request set is written too (the timeline: ddprun sends
  // SIGUSR1 before it stops a failed job's ranks).
  std::thread([fd = signal_pipe[0], keep = registry()] {
    char byte = 0;
    while (::read(fd, &byte, 1) > 0 || errno == EINTR) {
      dump_with(*keep, "SIGUSR1");
      std::function<void()> also;
      {
        std::lock_guard<std::mutex> lock(keep->mutex);
        also = keep->also_on_request;
      }
      if (also) {
        also();
      }
    }
  }).detach();
  struct sigaction action {};
  action.sa_handler = on_sigusr1;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &action, nullptr);
}

} // namespace

const char* to_string(FlightRecorder::State state) {
  switch (state) {
    case FlightRecorder::State::kQueued:
      return "queued";
    case FlightRecorder::State::kStarted:
      return "started";
    case FlightRecorder::State::kCompleted:
      return "completed";
    case FlightRecorder::State::kFailed:
      return "failed";
  }
  return "unknown";
}

void on_dump_request(std::function<void()> also) {
  Registry& r = *registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.also_on_request = std::move(also);
}

std::shared_ptr<FlightRecorder> FlightRecorder::create(std::string group, std::string backend, int rank, int size,
                                                       std::shared_ptr<CollectiveListener> listener) {
  const size_t capacity = capacity_from_env(rank, size, backend);
  if (capacity == 0) {
    return nullptr;
  }
  auto recorder = std::make_shared<FlightRecorder>(std::move(group), std::move(backend), rank, size, capacity,
                                                   registry(), std::move(listener));
  Registry& r = *registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.rank < 0) {
    r.rank = rank;
    r.size = size;
  }
  r.recorders.erase(std::remove_if(r.recorders.begin(), r.recorders.end(),
                                   [](const auto& weak) { return weak.expired(); }),
                    r.recorders.end());
  r.recorders.push_back(recorder);
  install_signal_dump_locked();
  return recorder;
}

FlightRecorder::FlightRecorder(std::string group, std::string backend, int rank, int size, size_t capacity,
                               std::shared_ptr<FlightRecorderRegistry> registry,
                               std::shared_ptr<CollectiveListener> listener)
    : group_(std::move(group)),
      backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      capacity_(capacity),
      registry_(std::move(registry)),
      listener_(std::move(listener)) {
  ring_.reserve(std::min<size_t>(capacity_, 64));
}

uint64_t FlightRecorder::queued(const Fingerprint& fingerprint) {
  Entry entry;
  entry.seq = fingerprint.seq;
  entry.op = fingerprint.op;
  entry.shape = fingerprint.shape();
  entry.dtype = fingerprint.dtype ? std::string(c10::toString(*fingerprint.dtype)) : "";
  entry.numel = fingerprint.numel;
  entry.reduce = fingerprint.reduce ? to_string(*fingerprint.reduce) : "";
  entry.root = fingerprint.root;
  entry.label = fingerprint.label;
  entry.queued_us = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  entry.id = next_id_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(entry));
  } else {
    ring_[entry.id % capacity_] = std::move(entry);
  }
  return next_id_ - 1;
}

void FlightRecorder::update(uint64_t id, State state, const std::string* error) {
  Entry ended; // for the listener: a copy, to hand over outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (id >= next_id_ || id + capacity_ < next_id_) {
      return; // overwritten since
    }
    Entry& entry = ring_[id % capacity_];
    entry.state = state;
    if (state == State::kStarted) {
      entry.started_us = now_us();
    } else {
      entry.completed_us = now_us();
    }
    if (error != nullptr) {
      entry.error = error->substr(0, kMaxErrorBytes);
    }
    if (listener_ == nullptr || state == State::kStarted) {
      return;
    }
    ended = entry;
  }
  listener_->ended(ended);
}

void FlightRecorder::started(uint64_t id) {
  update(id, State::kStarted, nullptr);
}

void FlightRecorder::completed(uint64_t id) {
  update(id, State::kCompleted, nullptr);
}

void FlightRecorder::failed(uint64_t id, const std::string& error, bool dump) {
  update(id, State::kFailed, &error);
  if (dump) {
    dump_with(*registry_, error.substr(0, kMaxErrorBytes));
  }
}

void FlightRecorder::failed(uint64_t id, const std::exception_ptr& error, bool dump) {
  std::string what = "an exception of unknown type";
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = error_message(e);
  } catch (...) {
  }
  failed(id, what, dump);
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> ordered;
  ordered.reserve(ring_.size());
  const uint64_t first = next_id_ > ring_.size() ? next_id_ - ring_.size() : 0;
  for (uint64_t id = first; id < next_id_; ++id) {
    ordered.push_back(ring_[id % capacity_]);
  }
  return ordered;
}

std::string flight_recorder_json(const std::string& reason) {
  return json_of(*registry(), reason);
}

std::string dump_flight_recorders(const std::string& reason) {
  return dump_with(*registry(), reason);
}

namespace {

std::string json_of(Registry& r, const std::string& reason) {
  std::vector<std::shared_ptr<FlightRecorder>> live;
  int rank = -1;
  int size = 0;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    rank = r.rank;
    size = r.size;
    for (const auto& weak : r.recorders) {
      if (auto recorder = weak.lock()) {
        live.push_back(std::move(recorder));
      }
    }
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string out = "{\"schema\": \"ddp-flight-recorder\", \"version\": 1";
  out += c10::str(", \"rank\": ", rank, ", \"world_size\": ", size, ", \"job\": ");
  append_json_string(out, flight_recorder::job_name());
  out += c10::str(", \"pid\": ", ::getpid(), ", \"host\": ");
  append_json_string(out, host);
  out += ", \"reason\": ";
  append_json_string(out, reason);
  out += c10::str(", \"dumped_at_us\": ", now_us(), ", \"groups\": [");
  for (size_t g = 0; g < live.size(); ++g) {
    const auto& recorder = *live[g];
    const auto entries = recorder.entries();
    out += g == 0 ? "\n  {\"name\": " : ",\n  {\"name\": ";
    append_json_string(out, recorder.group());
    out += ", \"backend\": ";
    append_json_string(out, recorder.backend());
    out += c10::str(", \"rank\": ", recorder.rank(), ", \"size\": ", recorder.size(), ", \"entries\": [");
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      out += c10::str(i == 0 ? "\n    " : ",\n    ", "{\"id\": ", e.id, ", \"seq\": ", e.seq, ", \"op\": ");
      append_json_string(out, e.op);
      out += ", \"shape\": ";
      append_json_string(out, e.shape);
      out += ", \"dtype\": ";
      append_json_string(out, e.dtype);
      out += c10::str(", \"numel\": ", e.numel, ", \"reduce\": ");
      append_json_string(out, e.reduce);
      out += c10::str(", \"root\": ", e.root, ", \"label\": ");
      append_json_string(out, e.label);
      out += c10::str(", \"state\": \"", to_string(e.state), "\", \"queued_us\": ",
                      e.queued_us, ", \"started_us\": ", e.started_us, ", \"completed_us\": ", e.completed_us,
                      ", \"error\": ");
      append_json_string(out, e.error);
      out += "}";
    }
    out += "]}";
  }
  out += "\n]}\n";
  return out;
}

std::string dump_with(Registry& r, const std::string& reason) {
  try {
    int rank = -1;
    bool any_live = false;
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      rank = r.rank;
      any_live = std::any_of(r.recorders.begin(), r.recorders.end(),
                             [](const std::weak_ptr<FlightRecorder>& w) { return !w.expired(); });
    }
    if (rank < 0 || !any_live) {
      // No group has recorded anything, or every group is gone (a SIGUSR1
      // while the program exits): the last dump, if any, stays as it was.
      return "";
    }
    const std::string text = json_of(r, reason);
    const std::string dir = flight_recorder::dump_directory();
    const std::string path = c10::str(dir, "/rank_", rank, ".json");
    const std::string problem = replace_file(path, text);
    if (!problem.empty()) {
      log_warning(c10::str("[rank ", rank, "] flight recorder: could not write its dump (", problem,
                           "); set ", kEnvFlightRecorderDir.name, " to a writable directory"));
      return "";
    }
    return path;
  } catch (const std::exception& e) {
    log_warning(c10::str("flight recorder: could not write its dump: ", error_message(e)));
    return "";
  } catch (...) {
    return "";
  }
}

} // namespace

} // namespace ddp::internal

namespace ddp {

std::string dump_flight_recorder(const std::string& reason) {
  return internal::dump_flight_recorders(reason);
}

} // namespace ddp
