// save_checkpoint killed at each point of a save: under ddprun with 2 ranks,
// rank 0 (the one that writes) kills itself with SIGKILL at a chosen point of
// its second save (DDP_TEST_CHECKPOINT_CRASH_AT, see Note [Checkpoint crash
// points] in src/nn/checkpoint_files.h). What it leaves must load as a matching
// pair: the old save before the commit, the new one after it; and the next
// save must remove the files the killed one left. The ranks are
// ddp_checkpoint_crash_main, started by ddprun, which this test forks and
// execs; every run has a deadline, after which it is SIGKILLed.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ftw.h>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifndef DDPRUN_PATH
#error "DDPRUN_PATH must name the ddprun binary (set in tests/nn/nn.cmake)"
#endif
#ifndef DDP_CHECKPOINT_CRASH_MAIN_PATH
#error "DDP_CHECKPOINT_CRASH_MAIN_PATH must name ddp_checkpoint_crash_main (tests/nn/nn.cmake)"
#endif

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The longest one ddprun run may take: a few steps of a tiny model on 2 ranks.
constexpr auto kDeadline = 90s;

// A fresh directory under /tmp, removed with its files.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/ddp_checkpoint_crash.XXXXXX";
    if (::mkdtemp(name) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    }
    path_ = name;
  }
  ~TempDir() {
    // Not std::filesystem: PyPI's LibTorch, which this test links, exports a
    // copy of it that shadows libstdc++'s (see docs/design.md).
    ::nftw(
        path_.c_str(),
        [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Outcome {
  int exit_code = -1; // -1 when ddprun did not exit normally
  bool timed_out = false;
  std::string output; // stdout and stderr, interleaved
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `ddprun --nproc-per-node 2 ddp_checkpoint_crash_main args...` to its
// end, or SIGKILLs it at kDeadline. Its output goes to a file in `scratch`.
Outcome run_ranks(const std::vector<std::string>& args, const std::string& scratch) {
  std::vector<std::string> strings = {DDPRUN_PATH, "--nproc-per-node", "2",
                                      DDP_CHECKPOINT_CRASH_MAIN_PATH};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) {
    argv.push_back(s.data());
  }
  argv.push_back(nullptr);
  const std::string log = scratch + "/ddprun.log";

  Outcome outcome;
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls: this test binary may have threads.
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      ::_exit(126);
    }
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return outcome;
  }
  const Clock::time_point deadline = Clock::now() + kDeadline;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      outcome.timed_out = true;
      ::kill(pid, SIGKILL); // ddprun's ranks die with it (PR_SET_PDEATHSIG)
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  if (WIFEXITED(status)) {
    outcome.exit_code = WEXITSTATUS(status);
  }
  outcome.output = read_file(log);
  std::remove(log.c_str());
  return outcome;
}

std::set<std::string> list_directory(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") {
        names.insert(name);
      }
    }
    ::closedir(listing);
  }
  return names;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct CrashCase {
  std::string point; // DDP_TEST_CHECKPOINT_CRASH_AT, or "none"
  std::string survivor; // the save that must load afterwards: "old" or "new"
  bool leaves_files; // the crash leaves a temporary or pending file behind
};

void PrintTo(const CrashCase& c, std::ostream* os) {
  *os << c.point;
}

class CheckpointCrashTest : public ::testing::TestWithParam<CrashCase> {};

TEST_P(CheckpointCrashTest, LeavesALoadableMatchingPair) {
  const CrashCase& c = GetParam();
  TempDir scratch;
  const std::string dir = scratch.path() + "/ckpt";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << std::strerror(errno);

  const Outcome save = run_ranks({"save", dir, c.point}, scratch.path());
  ASSERT_FALSE(save.timed_out) << save.output;
  if (c.point == "none") {
    ASSERT_EQ(save.exit_code, 0) << save.output;
  } else {
    // ddprun's verdict on rank 0, then the exit code of a SIGKILLed rank.
    ASSERT_EQ(save.exit_code, 128 + SIGKILL) << save.output;
    EXPECT_TRUE(contains(save.output, "ddprun: rank 0 (pid ")) << save.output;
    EXPECT_TRUE(contains(save.output, "was killed by signal 9 (SIGKILL)")) << save.output;
  }
  const std::set<std::string> left = list_directory(dir);
  EXPECT_EQ(left.count("ckpt.pt"), 1u) << "the crash left no ckpt.pt";
  const std::set<std::string> pair = {"ckpt.pt", "ckpt.pt.optimizer"};
  if (c.leaves_files) {
    EXPECT_NE(left, pair) << "the crash was expected to leave a temporary or pending file";
  } else {
    EXPECT_EQ(left, pair);
  }

  const Outcome verify = run_ranks({"verify", dir, c.survivor}, scratch.path());
  ASSERT_FALSE(verify.timed_out) << verify.output;
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_FALSE(contains(verify.output, "[FAILED]")) << verify.output;
  EXPECT_TRUE(contains(verify.output, "loaded the " + c.survivor + " save")) << verify.output;
}

INSTANTIATE_TEST_SUITE_P(
    EveryPoint,
    CheckpointCrashTest,
    ::testing::Values(
        CrashCase{"none", "new", false},
        CrashCase{"begin", "old", false},
        CrashCase{"optimizer-partial", "old", true},
        CrashCase{"optimizer-written", "old", true},
        CrashCase{"model-partial", "old", true},
        CrashCase{"model-written", "old", true},
        // The commit: ckpt.pt is the new save's, ckpt.pt.optimizer still the
        // old one's; the new optimizer state waits under its pending name.
        CrashCase{"committed", "new", true},
        CrashCase{"optimizer-renamed", "new", false}),
    [](const ::testing::TestParamInfo<CrashCase>& info) {
      std::string name = info.param.point;
      for (char& ch : name) {
        if (ch == '-') {
          ch = '_';
        }
      }
      return name;
    });

TEST(CheckpointPairTest, RefusesMismatchedAndIncompletePairsAndReadsOldFiles) {
  TempDir scratch;
  const std::string dir = scratch.path() + "/ckpt";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << std::strerror(errno);
  const Outcome errors = run_ranks({"errors", dir}, scratch.path());
  ASSERT_FALSE(errors.timed_out) << errors.output;
  EXPECT_EQ(errors.exit_code, 0) << errors.output;
  EXPECT_FALSE(contains(errors.output, "[FAILED]")) << errors.output;
  EXPECT_TRUE(contains(errors.output, "6 of 6 cases passed")) << errors.output;
}

} // namespace
