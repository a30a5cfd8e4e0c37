#include "plan/plan_recorder.h"

#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>

#include <ddp/plan.h>

#include "internal/env.h"
#include "internal/logging.h"
#include "internal/text_files.h"
#include "plan/memory_counter.h"

namespace ddp {
namespace internal {
namespace {

// Note [Plan report]
// `ddprun --plan` runs a program once per world size as rank 0 of a fake
// world (DDP_BACKEND=fake) and reads back what the program held and would
// have sent. The figures are collected here for the whole process: memory by
// the counting allocator (Note [Counting tensor memory]), started when the
// default group is made so that a real run counts from the same point; the
// bytes of every fake group (the default one and its subgroups: HSDP's
// shard and replicate groups) by kind, and cut into steps where DDP or FSDP
// begins a forward with gradients (where the timeline begins its steps),
// in a process that plans only, the last kMaxSteps of them.
// The report is written at destroy_process_group() and again at exit, so
// that a program that never destroys its group still leaves one.

// The most operations kept for last_step_calls, and steps kept.
constexpr size_t kMaxStepCalls = 1 << 16;
constexpr size_t kMaxSteps = 1000;

// Whether this process plans (the fake backend or DDP_PLAN_REPORT): the
// steps are marked only then, so that training costs nothing for it.
std::atomic<bool> g_planning{false};

struct State {
  std::mutex mutex;
  int rank = -1;
  int world_size = 0;
  std::string backend;
  bool bytes_counted = false;
  int64_t total_sent = 0;
  bool stepped = false;             // a step has begun
  int64_t setup_sent = 0;           // total_sent when the first step began
  int64_t setup_peak = 0;           // the peak tensor bytes before it
  std::deque<int64_t> step_starts;  // total_sent when each of the last kMaxSteps steps began
  std::deque<int64_t> step_peaks;   // the peak tensor bytes of each of them but the one under way
  std::map<std::string, FakeTraffic> traffic;
  std::vector<PlanReport::Call> step_calls; // since the last step began
  std::vector<std::vector<int>> groups;      // the world ranks of each group seen
  std::map<const void*, int> group_ids;      // a group's index in `groups`
};

State& state() {
  static auto* s = new State(); // never destroyed: written from exit handlers
  return *s;
}

std::string report_directory() {
  return env_get(kEnvPlanReport).value_or("");
}

void write_at_exit() {
  write_plan_report();
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) {
    return 0;
  }
  return static_cast<int64_t>(usage.ru_maxrss) * 1024; // Linux: kilobytes
}

std::string report_json(const PlanReport& report) {
  std::string out = "{\n";
  auto field = [&](const char* name, const std::string& value, bool last = false) {
    out += "  \"";
    out += name;
    out += "\": " + value + (last ? "\n" : ",\n");
  };
  std::string backend;
  append_json_string(backend, report.backend);
  field("rank", std::to_string(report.rank));
  field("world_size", std::to_string(report.world_size));
  field("backend", backend);
  field("counting_memory", report.counting_memory ? "true" : "false");
  field("tensor_bytes", std::to_string(report.tensor_bytes));
  field("peak_tensor_bytes", std::to_string(report.peak_tensor_bytes));
  field("peak_rss_bytes", std::to_string(report.peak_rss_bytes));
  field("bytes_counted", report.bytes_counted ? "true" : "false");
  field("setup_peak_tensor_bytes", std::to_string(report.setup_peak_tensor_bytes));
  std::string peaks = "[";
  for (size_t i = 0; i < report.step_peak_tensor_bytes.size(); ++i) {
    peaks += (i ? ", " : "") + std::to_string(report.step_peak_tensor_bytes[i]);
  }
  field("step_peak_tensor_bytes", peaks + "]");
  field("setup_bytes_sent", std::to_string(report.setup_bytes_sent));
  std::string steps = "[";
  for (size_t i = 0; i < report.step_bytes_sent.size(); ++i) {
    steps += (i ? ", " : "") + std::to_string(report.step_bytes_sent[i]);
  }
  field("step_bytes_sent", steps + "]");
  std::string traffic = "{";
  bool first = true;
  for (const auto& [op, counts] : report.traffic) {
    traffic += first ? "" : ", ";
    first = false;
    append_json_string(traffic, op);
    traffic += ": {\"calls\": " + std::to_string(counts.calls) +
        ", \"bytes_sent\": " + std::to_string(counts.bytes_sent) + "}";
  }
  field("traffic", traffic + "}");
  std::string calls = "[";
  for (size_t i = 0; i < report.last_step_calls.size(); ++i) {
    calls += i ? ", [" : "[";
    append_json_string(calls, report.last_step_calls[i].op);
    calls += ", " + std::to_string(report.last_step_calls[i].bytes_sent) + ", " +
        std::to_string(report.last_step_calls[i].tensor_bytes) + ", " +
        std::to_string(report.last_step_calls[i].group) + "]";
  }
  field("last_step_calls", calls + "]");
  std::string groups = "[";
  for (size_t g = 0; g < report.groups.size(); ++g) {
    groups += g ? ", [" : "[";
    for (size_t i = 0; i < report.groups[g].size(); ++i) {
      groups += (i ? ", " : "") + std::to_string(report.groups[g][i]);
    }
    groups += "]";
  }
  field("groups", groups + "]", /*last=*/true);
  return out + "}\n";
}

} // namespace

void plan_group_created(int rank, int world_size, const std::string& backend) {
  const bool fake = backend == "fake";
  const bool reporting = !report_directory().empty();
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.rank = rank;
    s.world_size = world_size;
    s.backend = backend;
  }
  if (fake || reporting) {
    start_counting_cpu_tensor_memory();
    g_planning.store(true);
  }
  if (reporting) {
    static std::once_flag once;
    std::call_once(once, [] { std::atexit(&write_at_exit); });
  }
}

void plan_begin_step() {
  if (!g_planning.load(std::memory_order_relaxed)) {
    return;
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const int64_t peak = start_new_peak_window();
  if (!s.stepped) {
    s.stepped = true;
    s.setup_sent = s.total_sent;
    s.setup_peak = peak;
  } else {
    s.step_peaks.push_back(peak);
  }
  s.step_starts.push_back(s.total_sent);
  if (s.step_starts.size() > kMaxSteps) {
    s.step_starts.pop_front();
    s.step_peaks.pop_front();
  }
  s.step_calls.clear();
}

void plan_count_sent(const char* op, int64_t bytes, int64_t tensor_bytes, const void* group,
                     const std::vector<int>& members) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  // A group's index; a new one when the address is another group's now (a
  // destroyed group's memory reused).
  auto known = s.group_ids.find(group);
  if (known == s.group_ids.end() || s.groups[static_cast<size_t>(known->second)] != members) {
    s.groups.push_back(members);
    known = s.group_ids.insert_or_assign(group, static_cast<int>(s.groups.size() - 1)).first;
  }
  s.bytes_counted = true;
  s.total_sent += bytes;
  FakeTraffic& kind = s.traffic[op];
  kind.calls += 1;
  kind.bytes_sent += bytes;
  if (s.step_calls.size() < kMaxStepCalls) { // a program that never steps still holds a bounded list
    s.step_calls.push_back(PlanReport::Call{op, bytes, tensor_bytes, known->second});
  }
}

void plan_group_destroyed() {
  write_plan_report();
}

} // namespace internal

PlanReport plan_report() {
  PlanReport report;
  {
    internal::State& s = internal::state();
    std::lock_guard<std::mutex> lock(s.mutex);
    report.rank = s.rank;
    report.world_size = s.world_size;
    report.backend = s.backend;
    report.bytes_counted = s.bytes_counted;
    report.setup_bytes_sent = s.stepped ? s.setup_sent : s.total_sent;
    for (size_t i = 0; i < s.step_starts.size(); ++i) {
      const int64_t end = i + 1 < s.step_starts.size() ? s.step_starts[i + 1] : s.total_sent;
      report.step_bytes_sent.push_back(end - s.step_starts[i]);
    }
    report.traffic = s.traffic;
    report.last_step_calls = s.step_calls;
    report.groups = s.groups;
    report.setup_peak_tensor_bytes = s.stepped ? s.setup_peak : internal::peak_in_window();
    if (s.stepped) {
      report.step_peak_tensor_bytes.assign(s.step_peaks.begin(), s.step_peaks.end());
      // The step under way: its peak so far, without starting a new window.
      report.step_peak_tensor_bytes.push_back(internal::peak_in_window());
    }
  }
  report.counting_memory = internal::counting_cpu_tensor_memory();
  report.tensor_bytes = internal::cpu_tensor_bytes();
  report.peak_tensor_bytes = internal::peak_cpu_tensor_bytes();
  report.peak_rss_bytes = internal::peak_rss_bytes();
  return report;
}

std::string write_plan_report() {
  try {
    const std::string directory = internal::report_directory();
    const PlanReport report = plan_report();
    if (directory.empty() || report.rank < 0) {
      return "";
    }
    const std::string path = directory + "/plan_rank_" + std::to_string(report.rank) + ".json";
    if (const std::string problem = internal::replace_file(path, internal::report_json(report));
        !problem.empty()) {
      internal::log_warning("[rank " + std::to_string(report.rank) + "/" +
                            std::to_string(report.world_size) + "] " +
                            internal::kEnvPlanReport.name + ": cannot write the plan report " +
                            path + ": " + problem);
      return "";
    }
    return path;
  } catch (const std::exception& e) {
    internal::log_warning(std::string("write_plan_report: ") + e.what());
    return "";
  }
}

} // namespace ddp
