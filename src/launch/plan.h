#pragma once

// `ddprun --plan`: a program run once per world size (and per variant of
// its arguments) as one rank of a fake world, and the table of what that
// rank would hold and send (docs/scaling.md). Plain C++17 and POSIX.

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::launch {

struct PlanOptions {
  /// The world sizes to plan for (--plan 2,8,1024).
  std::vector<int> world_sizes;
  /// Named sets of extra arguments, each appended to the program's in a
  /// run of its own (--plan-variant 'fsdp=--parallel fsdp'); none: one
  /// run per world size with the program's arguments alone.
  std::vector<std::pair<std::string, std::vector<std::string>>> variants;
  /// The rank the process plays (--plan-rank). Default: 0.
  int rank = 0;
  /// Ranks per node (LOCAL_WORLD_SIZE; --nproc-per-node). Default: the
  /// whole world on one node.
  std::optional<int> ranks_per_node;
  /// Where the runs' reports and output go (--plan-dir). Default: a new
  /// directory under $TMPDIR (or /tmp).
  std::string directory;
};

/// Parses --plan's list of world sizes ("2,8,1024"): each from 1 to 2^20.
/// Throws UsageError.
std::vector<int> parse_world_sizes(const std::string& text);

/// Parses --plan-variant's NAME=ARGS (ARGS split at spaces). Throws UsageError.
std::pair<std::string, std::vector<std::string>> parse_plan_variant(const std::string& text);

/// Runs `program` for each variant and world size, one after another, and
/// prints the table to `out` (the failures, with the end of the run's
/// output, to `err`). Returns 0 when every run succeeded and wrote its
/// report, 1 otherwise.
int run_plan(const PlanOptions& options, const std::vector<std::string>& program, std::FILE* out,
             std::FILE* err);

} // namespace ddp::launch
