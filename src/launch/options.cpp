#include "launch/options.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "internal/env.h" // the names of the variables ddprun sets; declarations only
#include "launch/unique_fd.h"

namespace ddp::launch {
namespace {

// --grace-period is given in seconds; a day is far more than any rank needs to
// flush, and keeps the milliseconds well inside an int64.
constexpr double kMaxGracePeriodSeconds = 24 * 3600;

std::string quoted(const std::string& value) {
  return "'" + value + "'";
}

int parse_int(const std::string& flag, const std::string& text, int min_value, int max_value) {
  int value = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [last, error] = std::from_chars(begin, end, value);
  if (text.empty() || error != std::errc() || last != end || value < min_value ||
      value > max_value) {
    std::string range = max_value == INT_MAX
        ? "an integer >= " + std::to_string(min_value)
        : "an integer from " + std::to_string(min_value) + " to " + std::to_string(max_value);
    throw UsageError(flag + " must be " + range + " (got " + quoted(text) + ")");
  }
  return value;
}

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text) {
  char* last = nullptr;
  errno = 0;
  double seconds = text.empty() ? -1 : std::strtod(text.c_str(), &last);
  if (text.empty() || errno != 0 || *last != '\0' || !std::isfinite(seconds) || seconds < 0 ||
      seconds > kMaxGracePeriodSeconds) {
    throw UsageError(flag + " must be a number of seconds from 0 to " +
                     std::to_string(static_cast<int>(kMaxGracePeriodSeconds)) + " (got " +
                     quoted(text) + ")");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

} // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine result;
  LaunchOptions& options = result.options;
  bool have_nproc = false;
  auto plan = [&]() -> PlanOptions& {
    if (!result.plan) {
      result.plan.emplace();
    }
    return *result.plan;
  };

  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      result.help = true;
      return result;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      break; // The program: everything from here on is its command line.
    }
    if (arg.compare(0, 2, "--") != 0) {
      throw UsageError("unknown option " + quoted(arg));
    }

    // Split --flag=value, and spell the flag with dashes only, so that
    // torchrun's --nproc_per_node is the same flag as --nproc-per-node.
    std::string flag = arg;
    std::optional<std::string> inline_value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    std::replace(flag.begin(), flag.end(), '_', '-');
    auto value = [&]() -> std::string {
      if (inline_value) {
        return *inline_value;
      }
      if (i + 1 >= args.size()) {
        throw UsageError("option " + flag + " needs a value");
      }
      return args[++i];
    };

    if (flag == "--nproc-per-node") {
      options.nproc_per_node = parse_int(flag, value(), 1, INT_MAX);
      have_nproc = true;
    } else if (flag == "--nnodes") {
      options.nnodes = parse_int(flag, value(), 1, INT_MAX);
    } else if (flag == "--node-rank") {
      options.node_rank = parse_int(flag, value(), 0, INT_MAX);
    } else if (flag == "--master-addr") {
      options.master_addr = value();
      if (options.master_addr.empty()) {
        throw UsageError("--master-addr must not be empty (got '')");
      }
    } else if (flag == "--master-port") {
      options.master_port = parse_int(flag, value(), 1, 65535);
    } else if (flag == "--grace-period") {
      options.grace_period = parse_seconds(flag, value());
    } else if (flag == "--max-restarts") {
      options.max_restarts = parse_int(flag, value(), 0, INT_MAX);
    } else if (flag == "--analyze") {
      result.analyze = value();
      if (result.analyze->empty()) {
        throw UsageError("--analyze needs a directory (got '')");
      }
    } else if (flag == "--trace") {
      options.trace_dir = value();
      if (options.trace_dir->empty()) {
        throw UsageError("--trace needs a directory (got '')");
      }
    } else if (flag == "--merge-trace") {
      result.merge_trace = value();
      if (result.merge_trace->empty()) {
        throw UsageError("--merge-trace needs a directory (got '')");
      }
    } else if (flag == "--plan") {
      plan().world_sizes = parse_world_sizes(value());
    } else if (flag == "--plan-variant") {
      plan().variants.push_back(parse_plan_variant(value()));
    } else if (flag == "--plan-rank") {
      plan().rank = parse_int(flag, value(), 0, INT_MAX);
    } else if (flag == "--plan-dir") {
      plan().directory = value();
      if (plan().directory.empty()) {
        throw UsageError("--plan-dir needs a directory (got '')");
      }
    } else if (flag == "--no-prefix") {
      if (inline_value) {
        throw UsageError("--no-prefix takes no value (got " + quoted(*inline_value) + ")");
      }
      options.prefix_output = false;
    } else {
      throw UsageError("unknown option " + quoted(arg));
    }
  }

  options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (result.analyze && result.merge_trace) {
    throw UsageError("--analyze and --merge-trace are two commands: give one");
  }
  if (result.analyze || result.merge_trace) {
    const char* command = result.analyze ? "--analyze" : "--merge-trace";
    if (!options.program.empty()) {
      throw UsageError(std::string(command) + " starts nothing: no program after it (got " +
                       quoted(options.program[0]) + ")");
    }
    return result;
  }
  if (result.plan) {
    if (result.plan->world_sizes.empty()) {
      throw UsageError("--plan-variant, --plan-rank and --plan-dir go with --plan SIZES (got no --plan)");
    }
    if (options.program.empty()) {
      throw UsageError("--plan: missing the program to plan for (got only options)");
    }
    if (have_nproc) {
      result.plan->ranks_per_node = options.nproc_per_node;
    }
    return result;
  }
  if (!have_nproc) {
    throw UsageError("--nproc-per-node is required");
  }
  if (options.node_rank >= options.nnodes) {
    throw UsageError("--node-rank must be less than --nnodes (got --node-rank " +
                     std::to_string(options.node_rank) + " with --nnodes " +
                     std::to_string(options.nnodes) + ")");
  }
  if (static_cast<long long>(options.nnodes) * options.nproc_per_node > INT_MAX) {
    throw UsageError("--nnodes times --nproc-per-node must fit in an int (got " +
                     std::to_string(options.nnodes) + " x " +
                     std::to_string(options.nproc_per_node) + ")");
  }
  if (options.nnodes > 1 && !options.master_port) {
    throw UsageError("--master-port is required when --nnodes is " +
                     std::to_string(options.nnodes) +
                     " (got none): every node must be given the same port");
  }
  if (options.max_restarts > 0 && options.nnodes > 1) {
    throw UsageError("--max-restarts needs --nnodes 1 (got --max-restarts " +
                     std::to_string(options.max_restarts) + " with --nnodes " +
                     std::to_string(options.nnodes) +
                     "): ddprun restarts the ranks of its own node only and cannot make the "
                     "other nodes restart with them; use torchrun for restarts across nodes");
  }
  if (options.program.empty()) {
    throw UsageError("missing the program to run (got only options)");
  }
  return result;
}

bool env_flag_is_set(const char* value) {
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

std::string mpi_backend_refusal(const LaunchOptions& options, const char* ddp_backend) {
  const int world = options.nnodes * options.nproc_per_node;
  if (ddp_backend == nullptr || std::strcmp(ddp_backend, "mpi") != 0 || world <= 1) {
    return "";
  }
  std::string program;
  for (const auto& arg : options.program) {
    program += " " + arg;
  }
  const std::string n = std::to_string(world);
  return "DDP_BACKEND=mpi: ddprun does not start MPI jobs; MPI's ranks must be started, and "
         "connected, by an MPI launcher. Run\n"
         "  DDP_BACKEND=mpi mpirun -np " + n + program + "\n"
         "(Open MPI; as root add --allow-run-as-root; on several nodes add --host or a hostfile), "
         "or under Slurm\n"
         "  DDP_BACKEND=mpi srun --mpi=pmix -n " + n + program + "\n"
         "or unset DDP_BACKEND to run the same program with Gloo under ddprun.";
}

const char* usage_text() {
  return R"(usage: ddprun [options] [--] program [args...]
       ddprun --analyze DIR
       ddprun --merge-trace DIR
       ddprun --plan SIZES [--plan-variant NAME=ARGS]... program [args...]

Starts --nproc-per-node copies of program on this node, one per rank, with the
variables torchrun sets: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (and
OMP_NUM_THREADS=1 when unset and there are several ranks). When a rank fails,
or ddprun gets SIGINT or SIGTERM, the other ranks are stopped: SIGTERM, then
SIGKILL after the grace period. After a failed rank, --max-restarts starts
the group again.

options:
  --nproc-per-node N  ranks to start on this node (required, N >= 1)
  --nnodes M          nodes in the job (default 1)
  --node-rank K       index of this node, 0 <= K < M (default 0)
  --master-addr A     host of rank 0's store (default 127.0.0.1)
  --master-port P     port of rank 0's store (default: a free port when
                      --nnodes is 1; required when --nnodes > 1)
  --grace-period S    seconds between SIGTERM and SIGKILL when stopping
                      ranks (default 5)
  --max-restarts N    when a rank fails, stop the group and start it again,
                      up to N times (default 0); the ranks get the count in
                      TORCHELASTIC_RESTART_COUNT and DDP_RESTART_COUNT
  --no-prefix         do not prefix output lines with "[rank R]: "
                      (DDPRUN_NO_PREFIX=1 does the same)
  --trace DIR         record a timeline of the last steps (DDP_TRACE_DIR=DIR
                      for every rank; DDP_TRACE_STEPS picks the steps), then
                      merge the ranks' files into DIR/trace.json (Perfetto,
                      chrome://tracing) and draw DIR/trace.svg
  --analyze DIR       start nothing: read the flight recorder dumps in DIR
                      (DDP_FLIGHT_RECORDER_DIR, rank_<R>.json) and say which
                      rank is behind, and in which collective
  --merge-trace DIR   start nothing: merge the timelines in DIR
                      (trace_rank_<R>.json, written by ranks run with
                      DDP_TRACE_DIR=DIR under any launcher), as --trace does
  --plan SIZES        start no job: run program once per world size in SIZES
                      (2,8,1024), alone, as rank 0 of a fake world
                      (DDP_BACKEND=fake), and print each run's peak tensor
                      memory and the bytes it would send per step
                      (docs/scaling.md); --nproc-per-node gives the ranks
                      per node (default: one node)
  --plan-variant NAME=ARGS
                      with --plan: also run with ARGS added to the program's
                      arguments, as a row of its own (repeat for each
                      strategy: 'fsdp=--parallel fsdp')
  --plan-rank R       with --plan: the rank to play (default 0)
  --plan-dir DIR      with --plan: where each run's report and output go
                      (default: a new directory under $TMPDIR or /tmp)
  -h, --help          print this help and exit

Flags may be written with underscores (--nproc_per_node) and as --flag=value.
With DDP_BACKEND=mpi in the environment ddprun refuses to start several ranks:
an MPI job is started by mpirun or srun (docs/launcher.md).
)";
}

std::vector<std::pair<std::string, std::string>> rank_environment(
    const LaunchOptions& options,
    int local_rank,
    const char* inherited_omp_num_threads) {
  if (!options.master_port) {
    throw std::logic_error("rank_environment: master_port is not set; pick one first");
  }
  const int rank = options.node_rank * options.nproc_per_node + local_rank;
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(options.nnodes * options.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(*options.master_port)},
  };
  // N ranks each running one OpenMP thread per core would oversubscribe the
  // CPU N times; torchrun sets 1 for the same reason.
  if (options.nproc_per_node > 1 && inherited_omp_num_threads == nullptr) {
    env.emplace_back("OMP_NUM_THREADS", "1");
  }
  return env;
}

std::vector<std::pair<std::string, std::string>> restart_environment(int restart_count) {
  const std::string count = std::to_string(restart_count);
  return {{internal::kEnvTorchelasticRestartCount.name, count},
          {internal::kEnvRestartCount.name, count}};
}

int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(addr.c_str(), "0", &hints, &found); rc != 0) {
    throw std::runtime_error("cannot resolve --master-addr " + quoted(addr) + ": " +
                             ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);

  std::string last_error = "no address found";
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
    if (!fd.valid() || ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (bound.ss_family == AF_INET) {
      return ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    }
    if (bound.ss_family == AF_INET6) {
      return ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
    }
    last_error = "unexpected address family " + std::to_string(bound.ss_family);
  }
  throw std::runtime_error("cannot find a free port on --master-addr " + quoted(addr) + ": " +
                           last_error + "; pass --master-port");
}

} // namespace ddp::launch
