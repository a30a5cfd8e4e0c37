#pragma once

// ddprun's side of the timeline (Note [Timeline] in timeline.cpp): reads the
// ranks' trace_rank_<R>.json, merges them into one Chrome Trace Event Format
// file, trace.json (each rank a process, each track a thread), and draws
// the last steps as trace.svg, one row per rank and track. Plain C++17 and
// POSIX, no Torch: it runs in ddprun (`--trace DIR`, `--merge-trace DIR`).

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "internal/json.h"

namespace ddp::timeline {

// A track of one rank: a row of the picture.
struct Row {
  int rank = 0;
  int tid = 0;
  std::string track;
};

// A complete or instant event, as the picture needs it.
struct Span {
  int rank = 0;
  int tid = 0;
  std::string name;
  double ts_us = 0;
  double dur_us = 0;
  int64_t step = 0;
  bool instant = false;
};

struct MergedTrace {
  std::vector<int> ranks;          // ascending
  int world_size = 0;              // as the files say
  std::vector<Row> rows;           // by rank, then thread id
  std::vector<json::Value> events; // every event of every file, as read
  std::vector<Span> spans;         // the X and i events
  int64_t first_step = 0;          // the steps every file holds
  int64_t last_step = 0;
  int64_t dropped_events = 0;      // over the per-step bound, all ranks
};

// Reads every trace_rank_<R>.json in `dir`. A file it cannot read, or not a
// ddp timeline, goes to `problems` with the reason; the others are merged.
MergedTrace read_traces(const std::string& dir, std::vector<std::string>& problems);

// The merged file's text.
std::string merged_json(const MergedTrace& trace);

// A self-contained SVG of the last `steps` steps (trace_svg.cpp).
std::string trace_svg(const MergedTrace& trace, int steps);

// Writes dir/trace.json and dir/trace.svg and says where on `out`; problems
// go to `err`. Returns 0, or 1 when it found no trace or could not write.
int merge_directory(const std::string& dir, std::FILE* out, std::FILE* err);

// Removes what an earlier job left in `dir`: trace_rank_*.json, trace.json,
// trace.svg (ddprun --trace, before it starts the ranks).
void clear_traces(const std::string& dir);

} // namespace ddp::timeline
