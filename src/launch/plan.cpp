#include "launch/plan.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "internal/env.h" // the names of the variables set for the run; declarations only
#include "internal/json.h"
#include "internal/text_files.h"
#include "launch/options.h"

namespace ddp::launch {
namespace {

constexpr int kMaxPlanWorldSize = 1 << 20;
constexpr size_t kMaxReportBytes = 1 << 20;
constexpr size_t kOutputTailBytes = 2000;

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
  return text;
}

std::string tail_of(const std::string& path) {
  try {
    std::string text = internal::read_bounded_file(path, 64 << 20);
    return text.size() > kOutputTailBytes ? "..." + text.substr(text.size() - kOutputTailBytes) : text;
  } catch (const std::exception& e) {
    return std::string("(cannot read ") + path + ": " + e.what() + ")";
  }
}

// Runs the program once as `rank` of `world_size`; returns the wait status,
// or -1 with `problem` set when it could not be started.
int run_once(const PlanOptions& options, const std::vector<std::string>& argv, int world_size,
             const std::string& directory, std::string& problem) {
  const int per_node = std::min(options.ranks_per_node.value_or(world_size), world_size);
  const std::string output = directory + "/output.txt";
  const pid_t pid = ::fork();
  if (pid < 0) {
    problem = std::string("fork failed: ") + std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    // The child: ddprun has one thread, so the environment and the file
    // may be set up here before exec.
    const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "ddprun --plan: cannot write %s: %s\n", output.c_str(), std::strerror(errno));
      std::_Exit(127);
    }
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    const auto set = [](const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); };
    set("RANK", std::to_string(options.rank));
    set("WORLD_SIZE", std::to_string(world_size));
    set("LOCAL_RANK", std::to_string(options.rank % per_node));
    set("LOCAL_WORLD_SIZE", std::to_string(per_node));
    set("GROUP_RANK", std::to_string(options.rank / per_node));
    set("DDP_BACKEND", "fake");
    set(internal::kEnvPlanReport.name, directory);
    ::unsetenv("MASTER_ADDR");
    ::unsetenv("MASTER_PORT");
    std::vector<char*> args;
    for (const auto& arg : argv) {
      args.push_back(const_cast<char*>(arg.c_str()));
    }
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "ddprun --plan: cannot run %s: %s\n", args[0], std::strerror(errno));
    std::_Exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      problem = std::string("waitpid failed: ") + std::strerror(errno);
      return -1;
    }
  }
  return status;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
        strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with status " + std::to_string(status);
}

} // namespace

std::vector<int> parse_world_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    int value = 0;
    const auto [last, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || error != std::errc() || last != item.data() + item.size() || value < 1 ||
        value > kMaxPlanWorldSize) {
      throw UsageError("--plan takes world sizes from 1 to " + std::to_string(kMaxPlanWorldSize) +
                       ", separated by commas (got '" + text + "': '" + item + "' is not one)");
    }
    sizes.push_back(value);
  }
  if (sizes.empty()) {
    throw UsageError("--plan needs at least one world size, e.g. --plan 2,8,1024 (got '" + text + "')");
  }
  return sizes;
}

std::pair<std::string, std::vector<std::string>> parse_plan_variant(const std::string& text) {
  const size_t eq = text.find('=');
  const std::string name = eq == std::string::npos ? "" : text.substr(0, eq);
  if (name.empty() || name.find_first_of("/ \t") != std::string::npos) {
    throw UsageError("--plan-variant takes NAME=ARGS, a name without spaces or slashes and the "
                     "arguments it adds to the program's (got '" + text + "')");
  }
  std::vector<std::string> args;
  std::stringstream words(text.substr(eq + 1));
  std::string word;
  while (words >> word) {
    args.push_back(word);
  }
  return {name, args};
}

int run_plan(const PlanOptions& options, const std::vector<std::string>& program, std::FILE* out,
             std::FILE* err) {
  auto variants = options.variants;
  if (variants.empty()) {
    variants.push_back({"-", {}});
  }
  std::fprintf(out, "ddprun --plan: %s as rank %d of each world, DDP_BACKEND=fake; reports in %s\n",
               program[0].c_str(), options.rank, options.directory.c_str());
  std::fprintf(out, "%-14s %8s %18s %14s %14s %6s %18s %8s\n", "variant", "world", "peak tensors",
               "peak RSS", "setup sent", "steps", "sent/step (last)", "seconds");
  std::fflush(out);
  int failures = 0;
  for (const auto& [name, extra] : variants) {
    for (const int world_size : options.world_sizes) {
      if (options.rank >= world_size) {
        std::fprintf(err, "ddprun --plan: %s at world %d: skipped, --plan-rank %d is not a rank of it\n",
                     (name == "-" ? std::string("the program") : "variant " + name).c_str(), world_size, options.rank);
        ++failures;
        continue;
      }
      const std::string label = name == "-" ? std::string("the program") : "variant " + name;
      const std::string directory =
          options.directory + "/" + (name == "-" ? std::string("run") : name) + "_w" + std::to_string(world_size);
      if (const std::string problem = internal::make_directories(directory); !problem.empty()) {
        std::fprintf(err, "ddprun --plan: %s\n", problem.c_str());
        return 1;
      }
      const std::string report_path = directory + "/plan_rank_" + std::to_string(options.rank) + ".json";
      ::unlink(report_path.c_str()); // an earlier plan's
      std::vector<std::string> argv = program;
      argv.insert(argv.end(), extra.begin(), extra.end());
      const auto started = std::chrono::steady_clock::now();
      std::string problem;
      const int status = run_once(options, argv, world_size, directory, problem);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(err, "ddprun --plan: %s at world %d %s; the end of its output (%s/output.txt):\n%s\n",
                     label.c_str(), world_size, status < 0 ? problem.c_str() : describe_status(status).c_str(),
                     directory.c_str(), tail_of(directory + "/output.txt").c_str());
        ++failures;
        continue;
      }
      json::Value report;
      try {
        report = json::parse(internal::read_bounded_file(report_path, kMaxReportBytes));
      } catch (const std::exception& e) {
        std::fprintf(err, "ddprun --plan: %s at world %d left no readable report %s (%s): does the "
                     "program call ddp::init_process_group()?\n",
                     label.c_str(), world_size, report_path.c_str(), e.what());
        ++failures;
        continue;
      }
      const json::Value* steps = report.find("step_bytes_sent");
      const size_t step_count = steps != nullptr && steps->is(json::Value::Kind::kArray) ? steps->items.size() : 0;
      const std::string last_step = step_count > 0 ? human_bytes(steps->items.back().number) : "-";
      std::fprintf(out, "%-14s %8d %18s %14s %14s %6zu %18s %8.1f\n", name.c_str(), world_size,
                   human_bytes(static_cast<double>(report.int_or("peak_tensor_bytes", 0))).c_str(),
                   human_bytes(static_cast<double>(report.int_or("peak_rss_bytes", 0))).c_str(),
                   human_bytes(static_cast<double>(report.int_or("setup_bytes_sent", 0))).c_str(), step_count,
                   last_step.c_str(), seconds);
      std::fflush(out);
    }
  }
  if (failures > 0) {
    std::fprintf(err, "ddprun --plan: %d of %zu runs failed\n", failures,
                 variants.size() * options.world_sizes.size());
  }
  return failures == 0 ? 0 : 1;
}

} // namespace ddp::launch
