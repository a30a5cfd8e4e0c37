// Reading PyTorch's flight recorder dumps in their JSON form, so that
// `ddprun --analyze` gives its verdict on a PyTorch job too.
//
// What such a dump holds (version 2.x, as PyTorch 2.11 writes it): no rank
// and no time of the dump; "pg_config", the groups by name with their
// "desc" and their "ranks" (a string, "[0, 1]"); "entries", one per
// collective, with "collective_seq_id" (from 1), "profiling_name"
// ("gloo:all_reduce", "nccl:all_gather"), "process_group" ([name, desc]; the
// default group's desc is "default_pg"), "input_dtypes" and "input_sizes",
// "state" (scheduled, started, completed), "time_created_ns",
// "time_discovered_started_ns", "retired" and "is_p2p"; "pg_status", each
// group's last completed collective by group id. The names and numbers are
// PyTorch's: its operations keep their names ("all_reduce #6"), its
// sequence numbers start at 1.

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/readers/dump_view.h"

namespace ddp::flight_recorder {
namespace {

using Kind = json::Value::Kind;

// "[0, 1, 3]" (or a JSON array) -> {0, 1, 3}.
std::vector<int> parse_ranks(const json::Value* ranks) {
  std::vector<int> out;
  if (ranks == nullptr) {
    return out;
  }
  if (ranks->is(Kind::kArray)) {
    for (const auto& r : ranks->items) {
      out.push_back(static_cast<int>(r.number));
    }
    return out;
  }
  int value = -1;
  for (const char c : ranks->text) {
    if (c >= '0' && c <= '9') {
      value = (value < 0 ? 0 : value * 10) + (c - '0');
    } else if (value >= 0) {
      out.push_back(value);
      value = -1;
    }
  }
  if (value >= 0) {
    out.push_back(value);
  }
  return out;
}

// "Float[4]", "Float[2x3], Long[8]" from the entry's dtypes and sizes.
std::string shape_of(const json::Value& entry) {
  const json::Value* dtypes = entry.find("input_dtypes");
  const json::Value* sizes = entry.find("input_sizes");
  if (dtypes == nullptr || !dtypes->is(Kind::kArray)) {
    return "";
  }
  std::string text;
  for (size_t i = 0; i < dtypes->items.size(); ++i) {
    text += (i == 0 ? "" : ", ") + dtypes->items[i].text + "[";
    if (sizes != nullptr && sizes->is(Kind::kArray) && i < sizes->items.size()) {
      const auto& dims = sizes->items[i].items;
      for (size_t d = 0; d < dims.size(); ++d) {
        text += (d == 0 ? "" : "x") + std::to_string(static_cast<int64_t>(dims[d].number));
      }
    }
    text += "]";
  }
  return text;
}

std::string state_of(const std::string& pytorch_state) {
  if (pytorch_state == "scheduled") {
    return "queued";
  }
  return pytorch_state; // started, completed
}

// pg_status[pg_id].last_completed_collective (a string), or -1.
int64_t last_completed(const json::Value& dump, const std::string& pg_id) {
  const json::Value* status = dump.find("pg_status");
  const json::Value* group = status == nullptr ? nullptr : status->find(pg_id);
  const json::Value* last = group == nullptr ? nullptr : group->find("last_completed_collective");
  if (last == nullptr) {
    return -1;
  }
  if (last->is(Kind::kNumber)) {
    return static_cast<int64_t>(last->number);
  }
  try {
    return std::stoll(last->text);
  } catch (const std::exception&) {
    return -1;
  }
}

} // namespace

bool is_pytorch_dump(const json::Value& dump) {
  const json::Value* entries = dump.find("entries");
  const json::Value* config = dump.find("pg_config");
  return dump.is(Kind::kObject) && entries != nullptr && entries->is(Kind::kArray) && config != nullptr &&
         config->is(Kind::kObject);
}

void read_pytorch_dump(const json::Value& dump, int rank, std::map<std::string, GroupView>& groups) {
  const std::string version = dump.string_or("version", "");
  if (version.rfind("2.", 0) != 0) {
    throw std::runtime_error("a PyTorch flight recorder dump of version '" + version +
                             "'; this ddprun reads version 2.x");
  }
  const json::Value& config = *dump.find("pg_config");
  // Each group's rank list, by name; PyTorch may leave the names empty.
  auto members_of = [&](const std::string& name) {
    if (const json::Value* group = config.find(name)) {
      return parse_ranks(group->find("ranks"));
    }
    return config.members.size() == 1 ? parse_ranks(config.members.begin()->second.find("ranks"))
                                      : std::vector<int>{};
  };
  std::map<std::string, bool> cleared;
  for (const auto& e : dump.find("entries")->items) {
    const json::Value* is_p2p = e.find("is_p2p");
    if (is_p2p != nullptr && is_p2p->boolean) {
      continue;
    }
    const json::Value* pg = e.find("process_group");
    std::string pg_name = "?";
    std::string desc;
    if (pg != nullptr && pg->is(Kind::kArray) && pg->items.size() == 2) {
      pg_name = pg->items[0].text;
      desc = pg->items[1].text;
    }
    const std::string name = desc == "default_pg" ? "default" : pg_name;
    const std::string profiling = e.string_or("profiling_name", "?");
    const auto colon = profiling.find(':');
    GroupView& group = groups[name];
    group.backend = colon == std::string::npos ? "?" : profiling.substr(0, colon);
    const std::vector<int> members = members_of(pg_name);
    const auto found = std::find(members.begin(), members.end(), rank);
    const int group_rank = found == members.end() ? rank : static_cast<int>(found - members.begin());
    group.size = std::max<int>(group.size, static_cast<int>(members.size()));
    RankView& view = group.ranks[group_rank];
    if (!cleared[name]) {
      view = RankView{};
      view.world_rank = rank;
      view.reason = "PyTorch flight recorder dump (version " + version + ")";
      cleared[name] = true;
    }
    Record r;
    r.op = colon == std::string::npos ? profiling : profiling.substr(colon + 1);
    r.shape = shape_of(e);
    r.state = state_of(e.string_or("state", "?"));
    // Gloo's records stay "scheduled": a retired entry, or one at or below
    // its group's last completed collective (pg_status), completed.
    const json::Value* retired = e.find("retired");
    const int64_t seq = e.int_or("collective_seq_id", -1);
    if ((retired != nullptr && retired->boolean) ||
        seq <= last_completed(dump, std::to_string(e.int_or("pg_id", -1)))) {
      r.state = "completed";
    }
    r.queued_us = e.int_or("time_created_ns", 0) / 1000;
    r.started_us = e.int_or("time_discovered_started_ns", 0) / 1000;
    view.by_seq[seq] = std::move(r);
  }
}

} // namespace ddp::flight_recorder
