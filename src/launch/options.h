#pragma once

// ddprun's command line: what it accepts, how it is checked, and the
// environment each rank gets from it. Plain C++17 and POSIX: the launcher
// includes no Torch header, so that it builds in seconds.

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "launch/plan.h"

namespace ddp::launch {

/// A bad command line. main() prints the message and the usage, and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What ddprun was asked to start. Flags are torchrun's, so that a command
/// line written for one works with the other.
/// Example: `ddprun --nproc-per-node 4 ./train --epochs 3` gives
/// `LaunchOptions{nproc_per_node = 4, program = {"./train", "--epochs", "3"}}`.
struct LaunchOptions {
  /// Ranks to start on this node (--nproc-per-node). Required, >= 1.
  int nproc_per_node = 0;
  /// Nodes in the job (--nnodes). Default: 1.
  int nnodes = 1;
  /// This node's index, 0 <= node_rank < nnodes (--node-rank). Default: 0.
  int node_rank = 0;
  /// Host of rank 0's store (--master-addr). Default: "127.0.0.1".
  std::string master_addr = "127.0.0.1";
  /// Port of rank 0's store (--master-port). Default: none, which means "pick
  /// a free one" on a single node; required when nnodes > 1.
  std::optional<int> master_port;
  /// Prefix each output line with "[rank R]: " (--no-prefix turns it off, as
  /// does DDPRUN_NO_PREFIX=1). Default: true.
  bool prefix_output = true;
  /// Time between SIGTERM and SIGKILL when ranks are stopped
  /// (--grace-period, in seconds). Default: 5 s.
  std::chrono::milliseconds grace_period{5000};
  /// How many times the whole group is stopped and started again when a
  /// rank fails (--max-restarts, as torchrun's), each time with a new
  /// rendezvous; see run_ranks. Only with nnodes == 1. Default: 0 (a failed
  /// rank ends the job).
  int max_restarts = 0;
  /// --trace DIR: the ranks record a timeline there (DDP_TRACE_DIR), and
  /// ddprun merges it into DIR/trace.json and DIR/trace.svg when the job
  /// ends (src/launch/readers/trace_merge.h). Default: none.
  std::optional<std::string> trace_dir;
  /// The program and its arguments, passed to execvp unchanged. Required.
  std::vector<std::string> program;
};

/// The parsed command line: either a request for help or options to run.
struct CommandLine {
  /// -h or --help was given; nothing else is checked.
  bool help = false;
  /// --analyze DIR: read the flight recorder dumps in DIR and say which rank
  /// is at fault (src/launch/readers/analyzer.h); nothing is started, and
  /// no other option is needed.
  std::optional<std::string> analyze;
  /// --merge-trace DIR: merge the timelines that ranks started by another
  /// launcher wrote there (DDP_TRACE_DIR); nothing is started.
  std::optional<std::string> merge_trace;
  /// --plan SIZES (with --plan-variant, --plan-rank, --plan-dir): run the
  /// program once per world size as one rank of a fake world and print what
  /// it holds and sends (src/launch/plan.h); --nproc-per-node is then
  /// optional and gives the ranks per node.
  std::optional<PlanOptions> plan;
  /// The checked options; meaningful only when help is false.
  LaunchOptions options;
};

/// Parses ddprun's arguments (argv[1..]). Accepts `--flag value` and
/// `--flag=value`, with dashes or underscores (`--nproc_per_node`). Options end
/// at the first argument that is not an option, or after `--`. Throws
/// UsageError naming the bad value.
CommandLine parse_command_line(const std::vector<std::string>& args);

/// True when an environment flag such as DDPRUN_NO_PREFIX is on: set, not
/// empty and not "0". `value` may be null (unset).
bool env_flag_is_set(const char* value);

/// Why ddprun will not start this job, or "" when it will: the ranks would
/// use ddp's MPI backend (`ddp_backend`, the value of DDP_BACKEND, is "mpi";
/// null when unset) and there are several of them. MPI's processes must be
/// started, and connected, by an MPI launcher (mpirun, srun), so the text
/// gives that command line.
std::string mpi_backend_refusal(const LaunchOptions& options, const char* ddp_backend);

/// The usage text printed by --help and after a bad command line.
const char* usage_text();

/// The variables that the rank with index `local_rank` on this node gets, on
/// top of ddprun's own environment: RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, and
/// OMP_NUM_THREADS=1 when there are several local ranks and
/// `inherited_omp_num_threads` (ddprun's own OMP_NUM_THREADS, null when
/// unset) is null, as torchrun does. `options.master_port` must be set.
std::vector<std::pair<std::string, std::string>> rank_environment(
    const LaunchOptions& options,
    int local_rank,
    const char* inherited_omp_num_threads);

/// The variables that tell each rank how many times the group was restarted
/// (0 at the first start, k after the k-th restart): torchrun's
/// TORCHELASTIC_RESTART_COUNT and ddp's DDP_RESTART_COUNT, with the same
/// value, so that a program knows to resume from its last checkpoint.
std::vector<std::pair<std::string, std::string>> restart_environment(int restart_count);

/// Binds port 0 on `addr` and returns the port the kernel chose. Another
/// process may take it before rank 0 binds it; torchrun takes the same risk.
/// Throws std::runtime_error when `addr` cannot be bound.
int pick_free_port(const std::string& addr);

} // namespace ddp::launch
