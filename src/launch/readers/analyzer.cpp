#include "launch/readers/analyzer.h"

#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "launch/readers/dump_view.h"
#include "launch/readers/launcher_account.h"
#include "internal/json.h"
#include "internal/text_files.h"

namespace ddp::flight_recorder {

namespace {

constexpr size_t kMaxFileBytes = size_t{256} << 20; // far above a dump of 1000000 entries per group
constexpr size_t kMaxMismatches = 10;
constexpr size_t kMaxErrorChars = 240;

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

std::string seconds(int64_t us) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << static_cast<double>(us) / 1e6 << " s";
  return s.str();
}

// Reads one dump, written by global rank `rank` (from its file name), into
// `groups`; throws std::runtime_error saying what is wrong.
// Which job a dump is of: its "job" and "world_size" fields (absent from
// PyTorch's dumps and from ddp's before version 0.2: "" and 0).
struct DumpOrigin {
  std::string job;
  int world_size = 0;
};

DumpOrigin read_dump(const std::string& path, int rank, std::map<std::string, GroupView>& groups) {
  const json::Value dump = json::parse(internal::read_bounded_file(path, kMaxFileBytes));
  if (is_pytorch_dump(dump)) {
    read_pytorch_dump(dump, rank, groups);
    return {};
  }
  if (!dump.is(json::Value::Kind::kObject) || dump.string_or("schema", "") != "ddp-flight-recorder") {
    throw std::runtime_error(
        "neither a ddp flight recorder dump (\"schema\": \"ddp-flight-recorder\") nor a PyTorch one in "
        "JSON (\"pg_config\" and \"entries\")");
  }
  if (dump.int_or("version", 0) != 1) {
    throw std::runtime_error("version " + std::to_string(dump.int_or("version", 0)) +
                             ", this ddprun reads version 1");
  }
  const json::Value* list = dump.find("groups");
  if (list == nullptr || !list->is(json::Value::Kind::kArray)) {
    throw std::runtime_error("no \"groups\" array");
  }
  for (const auto& g : list->items) {
    GroupView& group = groups[g.string_or("name", "?")];
    group.backend = g.string_or("backend", "?");
    group.size = std::max<int>(group.size, static_cast<int>(g.int_or("size", 0)));
    RankView& view = group.ranks[static_cast<int>(g.int_or("rank", -1))];
    view.dumped_at_us = dump.int_or("dumped_at_us", 0);
    view.reason = dump.string_or("reason", "");
    view.world_rank = static_cast<int>(dump.int_or("rank", -1));
    view.by_seq.clear();
    const json::Value* entries = g.find("entries");
    if (entries == nullptr || !entries->is(json::Value::Kind::kArray)) {
      continue;
    }
    for (const auto& e : entries->items) {
      Record r;
      r.op = e.string_or("op", "?");
      r.shape = e.string_or("shape", "");
      // Who issued it (ddp's own callers), shown with the call.
      if (const std::string label = e.string_or("label", ""); !label.empty()) {
        r.shape += " (" + label + ")";
      }
      r.state = e.string_or("state", "?");
      r.error = e.string_or("error", "");
      r.queued_us = e.int_or("queued_us", 0);
      r.started_us = e.int_or("started_us", 0);
      view.by_seq[e.int_or("seq", -1)] = std::move(r);
    }
  }
  return {dump.string_or("job", ""), static_cast<int>(dump.int_or("world_size", 0))};
}

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > kMaxErrorChars) {
    line = line.substr(0, kMaxErrorChars) + "...";
  }
  return line;
}

// The ranks named as `marker` N in `text`, each followed by `after`:
// ranks_after("... lost connection to rank 3 (...", "lost connection to rank ", " (").
std::vector<int> ranks_after(const std::string& text, const std::string& marker, const std::string& after) {
  std::vector<int> ranks;
  for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
    size_t end = at + marker.size();
    int rank = 0;
    while (end < text.size() && end - at - marker.size() < 9 && text[end] >= '0' && text[end] <= '9') {
      rank = rank * 10 + (text[end++] - '0');
    }
    if (end > at + marker.size() && text.compare(end, after.size(), after) == 0) {
      ranks.push_back(rank);
    }
  }
  return ranks;
}

// Whom the ranks' errors blame for the group's first failure: the rank of
// "rank N failed first" (the group's record in its store, Note [First
// failure] in src/comm/failure_ledger.cpp); else, reading each "lost
// connection to rank N" and "rank(s) [N] had not reached" as an arrow from
// the rank that wrote it to N, the one rank that arrows point at and that
// points at nobody itself (a rank that failed on its own, or left no dump).
std::optional<int> blamed_by_errors(const GroupView& group) {
  std::map<int, int> recorded;
  std::map<int, std::set<int>> arrows; // from each rank that blames another
  for (const auto& [rank, view] : group.ranks) {
    for (const auto& [seq, record] : view.by_seq) {
      if (record.state != "failed") {
        continue;
      }
      for (const int r : ranks_after(record.error, "rank ", " failed first (")) {
        ++recorded[r];
      }
      for (const int r : ranks_after(record.error, "lost connection to rank ", " (")) {
        arrows[rank].insert(r);
      }
      for (const int r : ranks_after(record.error, "rank(s) [", "] had not reached")) {
        arrows[rank].insert(r);
      }
    }
  }
  if (!recorded.empty()) {
    return std::max_element(recorded.begin(), recorded.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  }
  std::set<int> sinks;
  for (const auto& [from, targets] : arrows) {
    for (const int to : targets) {
      if (arrows.count(to) == 0) {
        sinks.insert(to);
      }
    }
  }
  if (sinks.size() == 1) {
    return *sinks.begin();
  }
  return std::nullopt;
}

// The verdict and the mismatches of one group. `launcher`: ddprun's account
// of the job's first failure, for the default group (whose ranks are the
// global ranks it names).
void analyze_group(const std::string& name, const GroupView& group, const LauncherAccount* launcher,
                   std::FILE* out) {
  std::vector<int> without_dump;
  for (int r = 0; r < group.size; ++r) {
    if (group.ranks.count(r) == 0) {
      without_dump.push_back(r);
    }
  }
  // Sequence numbers below `low` fell out of some rank's ring.
  int64_t low = 0;
  for (const auto& [rank, view] : group.ranks) {
    if (!view.by_seq.empty()) {
      low = std::max(low, view.by_seq.begin()->first);
    }
  }
  // Per rank, its first collective not completed (or the one after its last).
  int64_t frontier = INT64_MAX;
  std::map<int, int64_t> last;
  for (const auto& [rank, view] : group.ranks) {
    last[rank] = view.by_seq.empty() ? low - 1 : view.by_seq.rbegin()->first;
    int64_t first = last[rank] + 1;
    for (auto it = view.by_seq.lower_bound(low); it != view.by_seq.end(); ++it) {
      if (it->second.state != "completed") {
        first = it->first;
        break;
      }
    }
    frontier = std::min(frontier, first);
  }
  const std::string header = "group " + name + " (" + group.backend + ", " + std::to_string(group.size) + " ranks)";
  std::string op;
  bool named_without_dump = false;
  for (const auto& [rank, view] : group.ranks) {
    const auto found = view.by_seq.find(frontier);
    if (found != view.by_seq.end()) {
      op = found->second.op;
      break;
    }
  }
  if (group.ranks.empty()) {
    std::fprintf(out, "%s: no dump\n", header.c_str());
  } else if (op.empty()) {
    // Nobody has reached the frontier: every rank completed all it recorded.
    const auto& any = *group.ranks.begin();
    const auto last_op = any.second.by_seq.empty() ? std::string("nothing")
                                                   : any.second.by_seq.rbegin()->second.op + " #" +
                                                         std::to_string(any.second.by_seq.rbegin()->first);
    std::fprintf(out, "%s: every rank that wrote a dump completed every collective it recorded (the last: %s)\n",
                 header.c_str(), last_op.c_str());
  } else {
    std::map<std::string, std::vector<int>> never; // by "its last was ..."
    std::vector<std::string> parts;
    std::vector<int> completed;
    for (const auto& [rank, view] : group.ranks) {
      const auto found = view.by_seq.find(frontier);
      if (found == view.by_seq.end()) {
        const auto previous = view.by_seq.find(last[rank]);
        never[previous == view.by_seq.end() ? std::string("none recorded")
                                            : previous->second.op + " #" + std::to_string(last[rank])]
            .push_back(rank);
        continue;
      }
      const Record& r = found->second;
      const int64_t since = r.started_us > 0 ? r.started_us : r.queued_us;
      if (r.state == "completed") {
        completed.push_back(rank);
      } else if (r.state == "failed") {
        parts.push_back(join_ranks({rank}) + " failed in it: " + first_line(r.error));
      } else {
        parts.push_back(join_ranks({rank}) + (r.state == "queued" ? " issued it and waits for it" : " waits in it") +
                        (view.dumped_at_us > 0 && since > 0 ? " since " + seconds(view.dumped_at_us - since) : ""));
      }
    }
    std::vector<std::string> verdict;
    if (!without_dump.empty()) {
      // The likeliest culprits when the others wait: nothing is known of them.
      verdict.push_back(join_ranks(without_dump) + " left no dump (killed, or its flight recorder off)");
      named_without_dump = true;
    }
    for (const auto& [what, ranks] : never) {
      verdict.push_back(join_ranks(ranks) + " never called it (" + (ranks.size() == 1 ? "its" : "their") +
                        " last was " + what + ")");
    }
    verdict.insert(verdict.end(), parts.begin(), parts.end());
    if (!completed.empty()) {
      verdict.push_back(join_ranks(completed) + " completed it");
    }
    std::string line = header + ", " + op + " #" + std::to_string(frontier) + ": ";
    for (size_t i = 0; i < verdict.size(); ++i) {
      line += (i == 0 ? "" : "; ") + verdict[i];
    }
    std::fprintf(out, "%s\n", line.c_str());
  }
  // Who failed first. A rank that ddprun saw killed or stopped is the
  // culprit; one that exited with an error may have failed because of
  // another, which the ranks' errors then name.
  const bool launcher_knows = launcher != nullptr && launcher->first_failed < group.size;
  const auto blamed = blamed_by_errors(group);
  if (launcher_knows && (launcher->what.rfind("was ", 0) == 0 || !blamed || *blamed == launcher->first_failed)) {
    std::fprintf(out, "  first failure: rank %d (ddprun saw it: it %s)\n", launcher->first_failed,
                 launcher->what.c_str());
  } else if (blamed) {
    std::fprintf(out, "  first failure: rank %d (as the ranks' errors say%s)\n", *blamed,
                 launcher_knows ? ("; ddprun saw rank " + std::to_string(launcher->first_failed) + " end first: it " +
                                   launcher->what)
                                      .c_str()
                                : "");
  }
  // Collectives whose ranks disagree.
  std::set<int64_t> seqs;
  for (const auto& [rank, view] : group.ranks) {
    for (auto it = view.by_seq.lower_bound(low); it != view.by_seq.end(); ++it) {
      seqs.insert(it->first);
    }
  }
  size_t shown = 0;
  for (const int64_t seq : seqs) {
    std::map<std::string, std::vector<int>> calls;
    for (const auto& [rank, view] : group.ranks) {
      const auto found = view.by_seq.find(seq);
      if (found != view.by_seq.end()) {
        calls[found->second.op + " " + found->second.shape].push_back(rank);
      }
    }
    if (calls.size() < 2) {
      continue;
    }
    if (shown++ == kMaxMismatches) {
      std::fprintf(out, "  (more mismatches not shown)\n");
      break;
    }
    std::string line = "  mismatch at #" + std::to_string(seq) + ":";
    bool first = true;
    for (const auto& [call, ranks] : calls) {
      line += (first ? " " : ", ") + join_ranks(ranks) + " called " + call;
      first = false;
    }
    std::fprintf(out, "%s\n", line.c_str());
  }
  if (!without_dump.empty() && !named_without_dump) {
    std::fprintf(out, "  %s wrote no dump (killed before it could, or its flight recorder was off)\n",
                 join_ranks(without_dump).c_str());
  }
  for (const auto& [rank, view] : group.ranks) {
    std::fprintf(out, "  rank %d: dump written for: %s\n", rank, first_line(view.reason).c_str());
  }
}

// The rank that a dump's file name gives: ddp's rank_<R>.json, or PyTorch's
// <prefix>rank_<R> (its default, nccl_trace_rank_<R>) with or without .json;
// -1 for any other file.
int rank_of_file(std::string name) {
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
    name.resize(name.size() - 5);
  }
  const auto at = name.rfind("rank_");
  if (at == std::string::npos || at + 5 == name.size() || name.size() - at > 5 + 9) {
    return -1;
  }
  int rank = 0;
  for (size_t i = at + 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') {
      return -1;
    }
    rank = rank * 10 + (name[i] - '0');
  }
  return rank;
}

// " job 'ddprun-host-12' (world size 2): rank(s) 0, 1", for the refusal
// of mixed jobs.
std::string describe_job(const std::string& job, int world_size, const std::string& ranks, bool first) {
  return std::string(first ? " " : "; ") + (job.empty() ? std::string("a job that names none") : "job '" + job + "'") +
         (world_size > 0 ? " (world size " + std::to_string(world_size) + ")" : std::string()) + ": rank(s) " + ranks;
}

} // namespace

int analyze_directory(const std::string& dir, std::FILE* out, std::FILE* err) {
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) {
    std::fprintf(err, "ddprun --analyze: cannot read the directory %s\n", dir.c_str());
    return 1;
  }
  std::vector<std::pair<std::string, int>> files; // and the rank the name gives
  while (const dirent* entry = ::readdir(handle)) {
    const std::string file = entry->d_name;
    if (const int rank = rank_of_file(file); rank >= 0) {
      files.emplace_back(file, rank);
    }
  }
  ::closedir(handle);
  std::sort(files.begin(), files.end());
  std::map<std::string, GroupView> groups;
  size_t read = 0;
  // The jobs the dumps come from: each (job, world size) with its ranks.
  std::map<std::pair<std::string, int>, std::vector<int>> jobs;
  for (const auto& [file, rank] : files) {
    try {
      const DumpOrigin origin = read_dump(dir + "/" + file, rank, groups);
      jobs[{origin.job, origin.world_size}].push_back(rank);
      ++read;
    } catch (const std::exception& e) {
      std::fprintf(err, "ddprun --analyze: skipping %s/%s: %s\n", dir.c_str(), file.c_str(), e.what());
    }
  }
  if (read == 0) {
    std::fprintf(err,
                 "ddprun --analyze: no flight recorder dump in %s (expected rank_<R>.json files, which each "
                 "rank writes there when DDP_FLIGHT_RECORDER_DIR names it, or PyTorch's JSON dumps named "
                 "<prefix>rank_<R>)\n",
                 dir.c_str());
    return 1;
  }
  if (jobs.size() > 1) {
    std::string list;
    for (const auto& [job, ranks] : jobs) {
      std::string numbers;
      for (const int r : ranks) {
        numbers += (numbers.empty() ? "" : ", ") + std::to_string(r);
      }
      list += describe_job(job.first, job.second, numbers, list.empty());
    }
    std::fprintf(err,
                 "ddprun --analyze: %s holds the dumps of %zu jobs:%s; a verdict on a mix would be wrong: "
                 "analyze one job's dumps (each job writes to a folder of its own, "
                 "$TMPDIR/ddp_flight_recorder/<job>, unless DDP_FLIGHT_RECORDER_DIR names one for all)\n",
                 dir.c_str(), jobs.size(), list.c_str());
    return 1;
  }
  std::fprintf(out, "ddprun --analyze: %zu dump(s) in %s\n", read, dir.c_str());
  // ddprun's own account of who failed first, when it is of the same job.
  std::optional<LauncherAccount> launcher;
  try {
    launcher = read_launcher_account(dir);
  } catch (const std::exception& e) {
    std::fprintf(err, "ddprun --analyze: skipping %s\n", e.what());
  }
  if (const std::string& job = jobs.begin()->first.first; launcher && !job.empty() && launcher->job != job) {
    launcher.reset(); // another job's, left in a shared folder
  }
  if (launcher) {
    std::fprintf(out, "ddprun's account (attempt %d): rank %d %s, the first rank to fail\n", launcher->attempt,
                 launcher->first_failed, launcher->what.c_str());
  }
  if (const auto found = groups.find("default"); found != groups.end()) {
    analyze_group(found->first, found->second, launcher ? &*launcher : nullptr, out);
  }
  for (const auto& [name, group] : groups) {
    if (name != "default") {
      analyze_group(name, group, nullptr, out);
    }
  }
  return 0;
}

} // namespace ddp::flight_recorder
