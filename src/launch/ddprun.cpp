// ddprun: starts the ranks of a ddp job on one node, as torchrun does.
//
// Usage: ddprun --nproc-per-node 4 ./train --epochs 3
// starts ./train four times with RANK, WORLD_SIZE, LOCAL_RANK, ... set, and
// prints their output with "[rank R]: " in front of each line. See
// docs/launcher.md for every flag and variable.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "launch/readers/analyzer.h"
#include "launch/options.h"
#include "launch/supervisor.h"
#include "launch/readers/trace_merge.h"

namespace {

// Exit codes, as the shell and torchrun's argparse use them.
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// A descriptor 0-2 that ddprun was started without would be taken by the
// first pipe it opens, and a rank would then write its output into the wrong
// pipe. /dev/null fills the gap.
void ensure_standard_fds_open() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY); // takes the lowest free: fd
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  using namespace ddp::launch;
  ensure_standard_fds_open();

  CommandLine command_line;
  try {
    command_line = parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    std::fprintf(stderr,
                 "ddprun: %s\n"
                 "usage: ddprun [options] [--] program [args...]\n"
                 "Run 'ddprun --help' for the options.\n",
                 e.what());
    return kExitUsage;
  }
  if (command_line.help) {
    std::fputs(usage_text(), stdout);
    return 0;
  }
  if (command_line.analyze) {
    return ddp::flight_recorder::analyze_directory(*command_line.analyze, stdout, stderr);
  }
  if (command_line.merge_trace) {
    return ddp::timeline::merge_directory(*command_line.merge_trace, stdout, stderr);
  }
  if (command_line.plan) {
    PlanOptions& plan = *command_line.plan;
    if (plan.directory.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddprun-plan-XXXXXX";
      if (::mkdtemp(pattern.data()) == nullptr) {
        std::fprintf(stderr, "ddprun --plan: cannot create a directory %s: %s\n", pattern.c_str(),
                     std::strerror(errno));
        return kExitFailure;
      }
      plan.directory = pattern;
    }
    return run_plan(plan, command_line.options.program, stdout, stderr);
  }

  LaunchOptions& options = command_line.options;
  if (env_flag_is_set(std::getenv("DDPRUN_NO_PREFIX"))) {
    options.prefix_output = false;
  }
  if (const std::string refusal = mpi_backend_refusal(options, std::getenv("DDP_BACKEND"));
      !refusal.empty()) {
    std::fprintf(stderr, "ddprun: %s\n", refusal.c_str());
    return kExitUsage;
  }
  // The job's name, which the ranks inherit: their flight recorder dumps go
  // to a folder of this job's own (src/flight_recorder/dump_directory.h).
  // On one node this process names it; on several, every node's ddprun must
  // give the same name: the rendezvous' address.
  if (const char* job = std::getenv("DDP_JOB_ID"); job == nullptr || *job == '\0') {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    const std::string name = options.nnodes > 1 && options.master_port
        ? "ddprun-" + options.master_addr + "-" + std::to_string(*options.master_port)
        : "ddprun-" + std::string(host) + "-" + std::to_string(::getpid());
    ::setenv("DDP_JOB_ID", name.c_str(), 1);
  }
  if (options.trace_dir) {
    // The ranks inherit it; an earlier job's files would be merged with theirs.
    ddp::timeline::clear_traces(*options.trace_dir);
    ::setenv("DDP_TRACE_DIR", options.trace_dir->c_str(), 1);
  }
  int status = kExitFailure;
  try {
    status = run_ranks(options); // picks a free port when none was given
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: %s\n", e.what());
  }
  if (options.trace_dir) {
    std::fflush(stdout);
    // The job's status stands; a merge that fails says so on stderr.
    ddp::timeline::merge_directory(*options.trace_dir, stdout, stderr);
  }
  return status;
}
