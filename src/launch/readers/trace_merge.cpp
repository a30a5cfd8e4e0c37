#include "launch/readers/trace_merge.h"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <stdexcept>

#include "internal/text_files.h"

namespace ddp::timeline {

namespace {

constexpr size_t kMaxFileBytes = size_t{512} << 20; // a bound for bad input
// The steps trace.svg draws.
constexpr int kPictureSteps = 3;

// The rank in "trace_rank_<R>.json", or -1.
int rank_of_file(const std::string& file) {
  const std::string prefix = "trace_rank_";
  const std::string suffix = ".json";
  if (file.size() <= prefix.size() + suffix.size() || file.compare(0, prefix.size(), prefix) != 0 ||
      file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits = file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::atoi(digits.c_str());
}

std::vector<std::pair<int, std::string>> trace_files(const std::string& dir) {
  std::vector<std::pair<int, std::string>> files;
  if (DIR* handle = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(handle)) {
      if (const int rank = rank_of_file(entry->d_name); rank >= 0) {
        files.emplace_back(rank, entry->d_name);
      }
    }
    ::closedir(handle);
  }
  std::sort(files.begin(), files.end());
  return files;
}

double number_or(const json::Value& object, const std::string& name, double fallback) {
  const json::Value* member = object.find(name);
  return member != nullptr && member->is(json::Value::Kind::kNumber) ? member->number : fallback;
}

// One rank's file into `trace` (empty before); throws std::runtime_error
// saying what is wrong.
void read_trace(const std::string& path, int rank, MergedTrace& trace, std::map<std::pair<int, int>, std::string>& tracks) {
  const json::Value document = json::parse(internal::read_bounded_file(path, kMaxFileBytes));
  const json::Value* other = document.find("otherData");
  const json::Value* events = document.find("traceEvents");
  if (other == nullptr || other->string_or("schema", "") != "ddp-timeline" || events == nullptr ||
      !events->is(json::Value::Kind::kArray)) {
    throw std::runtime_error("not a ddp timeline (\"otherData\": {\"schema\": \"ddp-timeline\"} and a "
                             "\"traceEvents\" array)");
  }
  if (other->int_or("rank", -1) != rank) {
    throw std::runtime_error("its name says rank " + std::to_string(rank) + ", its content rank " +
                             std::to_string(other->int_or("rank", -1)));
  }
  trace.world_size = static_cast<int>(other->int_or("world_size", 0));
  trace.dropped_events = other->int_or("dropped_events", 0);
  trace.first_step = other->int_or("first_step", 0);
  trace.last_step = other->int_or("last_step", 0);
  for (const json::Value& event : events->items) {
    if (!event.is(json::Value::Kind::kObject) || event.int_or("pid", -1) != rank) {
      throw std::runtime_error("an event that is not an object of process (pid) " + std::to_string(rank));
    }
    const std::string ph = event.string_or("ph", "");
    const int tid = static_cast<int>(event.int_or("tid", 0));
    if (ph == "M" && event.string_or("name", "") == "thread_name") {
      if (const json::Value* args = event.find("args")) {
        tracks[{rank, tid}] = args->string_or("name", "");
      }
    } else if (ph == "X" || ph == "i") {
      Span span;
      span.rank = rank;
      span.tid = tid;
      span.name = event.string_or("name", "");
      span.ts_us = number_or(event, "ts", 0);
      span.dur_us = number_or(event, "dur", 0);
      span.instant = ph == "i";
      if (const json::Value* args = event.find("args")) {
        span.step = args->int_or("step", 0);
      }
      trace.spans.push_back(std::move(span));
    }
    trace.events.push_back(event);
  }
}

} // namespace

MergedTrace read_traces(const std::string& dir, std::vector<std::string>& problems) {
  MergedTrace trace;
  std::map<std::pair<int, int>, std::string> tracks;
  for (const auto& [rank, file] : trace_files(dir)) {
    try {
      MergedTrace one;
      std::map<std::pair<int, int>, std::string> its_tracks;
      read_trace(dir + "/" + file, rank, one, its_tracks);
      // Taken whole or not at all: a bad event leaves nothing half-merged.
      trace.world_size = std::max(trace.world_size, one.world_size);
      trace.dropped_events += one.dropped_events;
      trace.first_step = trace.ranks.empty() ? one.first_step : std::max(trace.first_step, one.first_step);
      trace.last_step = trace.ranks.empty() ? one.last_step : std::min(trace.last_step, one.last_step);
      trace.ranks.push_back(rank);
      std::move(one.events.begin(), one.events.end(), std::back_inserter(trace.events));
      std::move(one.spans.begin(), one.spans.end(), std::back_inserter(trace.spans));
      tracks.insert(its_tracks.begin(), its_tracks.end());
    } catch (const std::exception& e) {
      problems.push_back(dir + "/" + file + ": " + e.what());
    }
  }
  for (const auto& [key, name] : tracks) {
    trace.rows.push_back(Row{key.first, key.second, name});
  }
  return trace;
}

std::string merged_json(const MergedTrace& trace) {
  std::string out = "{\"traceEvents\": [";
  for (size_t i = 0; i < trace.events.size(); ++i) {
    out += i == 0 ? "\n" : ",\n";
    json::write(trace.events[i], out);
  }
  out += "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"schema\": \"ddp-timeline-merged\", \"version\": 1, "
         "\"ranks\": [";
  for (size_t i = 0; i < trace.ranks.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(trace.ranks[i]);
  }
  out += "], \"world_size\": " + std::to_string(trace.world_size) +
         ", \"first_step\": " + std::to_string(trace.first_step) +
         ", \"last_step\": " + std::to_string(trace.last_step) +
         ", \"dropped_events\": " + std::to_string(trace.dropped_events) + "}\n}\n";
  return out;
}

int merge_directory(const std::string& dir, std::FILE* out, std::FILE* err) {
  std::vector<std::string> problems;
  const MergedTrace trace = read_traces(dir, problems);
  for (const std::string& problem : problems) {
    std::fprintf(err, "ddprun: timeline: skipping %s\n", problem.c_str());
  }
  if (trace.ranks.empty()) {
    std::fprintf(err,
                 "ddprun: timeline: no trace in %s (expected trace_rank_<R>.json, which each rank "
                 "writes there at exit when DDP_TRACE_DIR names it)\n",
                 dir.c_str());
    return 1;
  }
  const std::string json_path = dir + "/trace.json";
  const std::string svg_path = dir + "/trace.svg";
  std::string problem = internal::replace_file(json_path, merged_json(trace));
  if (problem.empty()) {
    problem = internal::replace_file(svg_path, trace_svg(trace, kPictureSteps));
  }
  if (!problem.empty()) {
    std::fprintf(err, "ddprun: timeline: %s\n", problem.c_str());
    return 1;
  }
  std::string missing;
  for (int rank = 0; rank < trace.world_size; ++rank) {
    if (!std::binary_search(trace.ranks.begin(), trace.ranks.end(), rank)) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
    }
  }
  std::fprintf(out,
               "ddprun: timeline of %zu rank(s), steps %lld-%lld, in %s (open it in https://ui.perfetto.dev "
               "or chrome://tracing); the last steps drawn in %s\n",
               trace.ranks.size(), static_cast<long long>(trace.first_step),
               static_cast<long long>(trace.last_step), json_path.c_str(), svg_path.c_str());
  if (!missing.empty()) {
    std::fprintf(out, "ddprun: timeline: no trace from rank(s) %s (a rank writes it when it exits normally)\n",
                 missing.c_str());
  }
  if (trace.dropped_events > 0) {
    std::fprintf(out, "ddprun: timeline: %lld event(s) were over the per-step bound and not kept\n",
                 static_cast<long long>(trace.dropped_events));
  }
  return 0;
}

void clear_traces(const std::string& dir) {
  for (const auto& [rank, file] : trace_files(dir)) {
    std::remove((dir + "/" + file).c_str());
  }
  std::remove((dir + "/trace.json").c_str());
  std::remove((dir + "/trace.svg").c_str());
}

} // namespace ddp::timeline
