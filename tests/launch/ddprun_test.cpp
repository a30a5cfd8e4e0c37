// ddprun as a process, started with fork+exec as a user starts it. The ranks
// are /bin/sh scripts or ddprun_test_writer. Every wait has a deadline
// (kDeadline): a ddprun that hangs fails its test and is SIGKILLed, it does
// not hang the suite.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ftw.h>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launch/unique_fd.h"

#ifndef DDPRUN_PATH
#error "DDPRUN_PATH must name the ddprun binary (set in tests/launch/launch.cmake)"
#endif
#ifndef DDPRUN_TEST_WRITER_PATH
#error "DDPRUN_TEST_WRITER_PATH must name ddprun_test_writer (set in tests/launch/launch.cmake)"
#endif
#ifndef DDPRUN_TEST_PORT_RANK_PATH
#error "DDPRUN_TEST_PORT_RANK_PATH must name ddprun_test_port_rank (tests/launch/launch.cmake)"
#endif

extern char** environ; // POSIX declares it in no header.

namespace ddp::launch {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Args = std::vector<std::string>;
using EnvVars = std::vector<std::pair<std::string, std::string>>;

// The longest any test waits for ddprun or for its ranks to start.
constexpr milliseconds kDeadline = 20s;
// "Well under" the 60 s that the ranks of the stop tests sleep: a stop that
// works takes milliseconds, or the grace period when a rank ignores SIGTERM.
constexpr milliseconds kPromptly = 10s;

// How a ddprun run ended.
struct Outcome {
  int exit_code = -1; // -1 when ddprun did not exit normally
  int term_signal = 0; // the signal that killed ddprun, if one did
  bool timed_out = false; // it ran past its deadline and was SIGKILLed
  std::string out;
  std::string err;
  milliseconds elapsed{0};
};

std::string describe(const Outcome& outcome) {
  std::ostringstream text;
  text << "exit code " << outcome.exit_code << ", signal " << outcome.term_signal
       << (outcome.timed_out ? ", TIMED OUT" : "") << ", " << outcome.elapsed.count() << " ms\n"
       << "--- stdout ---\n"
       << outcome.out << "--- stderr ---\n"
       << outcome.err << "---";
  return text.str();
}

// One ddprun process, its stdout and stderr captured.
// Thread-safety: none; one test thread uses it.
class Ddprun {
 public:
  // Starts `ddprun args...`. Its environment is ours, less DDPRUN_NO_PREFIX
  // and OMP_NUM_THREADS (so that the caller's do not change the outcome),
  // with `set` put over it.
  explicit Ddprun(const Args& args, const EnvVars& set = {}) {
    std::vector<std::string> argv_strings{DDPRUN_PATH};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<std::string> env_strings;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string text(*entry);
      const std::string name = text.substr(0, text.find('='));
      const bool replaced = name == "DDPRUN_NO_PREFIX" || name == "OMP_NUM_THREADS" ||
          std::any_of(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; });
      if (!replaced) {
        env_strings.push_back(text);
      }
    }
    for (const auto& [name, value] : set) {
      env_strings.push_back(name + "=" + value);
    }
    std::vector<char*> argv = pointers(argv_strings);
    std::vector<char*> envp = pointers(env_strings);

    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return;
    }
    UniqueFd out_write(out_pipe[1]);
    UniqueFd err_write(err_pipe[1]);
    out_.reset(out_pipe[0]);
    err_.reset(err_pipe[0]);

    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls: this test binary may have threads.
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      // As from an interactive shell, whatever ran this test: ddprun keeps
      // SIGINT ignored when it starts with it ignored (a background job).
      for (int signal_number : {SIGINT, SIGQUIT, SIGHUP, SIGTERM, SIGPIPE}) {
        ::signal(signal_number, SIG_DFL);
      }
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(126);
    }
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
    }
  }

  Ddprun(const Ddprun&) = delete;
  Ddprun& operator=(const Ddprun&) = delete;

  ~Ddprun() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }

  // Reads ddprun's output until it exits and closes both streams, or until
  // `deadline` has passed since it started (then SIGKILLs it).
  Outcome wait(milliseconds deadline = kDeadline) {
    Outcome outcome;
    int status = 0;
    bool exited = pid_ <= 0;
    while (true) {
      std::vector<pollfd> fds;
      std::vector<std::pair<UniqueFd*, std::string*>> streams;
      for (auto [fd, text] : {std::pair{&out_, &outcome.out}, std::pair{&err_, &outcome.err}}) {
        if (fd->valid()) {
          fds.push_back({fd->get(), POLLIN, 0});
          streams.emplace_back(fd, text);
        }
      }
      if (fds.empty()) {
        std::this_thread::sleep_for(5ms);
      } else if (::poll(fds.data(), fds.size(), 20) > 0) {
        for (size_t i = 0; i < fds.size(); ++i) {
          if (fds[i].revents == 0) {
            continue;
          }
          char buffer[65536];
          const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
          if (n > 0) {
            streams[i].second->append(buffer, static_cast<size_t>(n));
          } else if (n == 0 || errno != EINTR) {
            streams[i].first->reset();
          }
        }
      }
      if (!exited && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited = true;
      }
      if (exited && !out_.valid() && !err_.valid()) {
        break;
      }
      if (Clock::now() - start_ > deadline) {
        outcome.timed_out = true;
        if (!exited) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, &status, 0);
          exited = true;
        }
        break;
      }
    }
    outcome.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start_);
    if (pid_ > 0) {
      if (WIFEXITED(status)) {
        outcome.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        outcome.term_signal = WTERMSIG(status);
      }
    }
    pid_ = -1;
    return outcome;
  }

 private:
  static std::vector<char*> pointers(std::vector<std::string>& strings) {
    std::vector<char*> result;
    for (std::string& s : strings) {
      result.push_back(s.data());
    }
    result.push_back(nullptr);
    return result;
  }

  pid_t pid_ = -1;
  UniqueFd out_;
  UniqueFd err_;
  Clock::time_point start_;
};

// Runs ddprun to completion.
Outcome run_ddprun(const Args& args, const EnvVars& set = {}) {
  Ddprun ddprun(args, set);
  return ddprun.wait();
}

// A fresh directory under /tmp, removed with its files.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/ddprun_test.XXXXXX";
    if (::mkdtemp(name) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    }
    path_ = name;
  }
  ~TempDir() {
    // Depth first, without following links. (Not std::filesystem: PyPI's
    // LibTorch, which this test links, exports a copy of it that shadows
    // libstdc++'s; see docs/design.md.)
    ::nftw(
        path_.c_str(),
        [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Shell code that writes the shell's pid to <dir>/<name>, atomically (the
// test polls for the file).
std::string write_pid_file(const TempDir& dir, const std::string& name,
                           const std::string& pid = "$$") {
  const std::string file = dir.path() + "/" + name;
  return "echo " + pid + " > " + file + ".tmp && mv " + file + ".tmp " + file + "; ";
}

// Shell code that waits until <dir>/<name> exists.
std::string wait_for_file(const TempDir& dir, const std::string& name) {
  return "while [ ! -f " + dir.path() + "/" + name + " ]; do sleep 0.01; done; ";
}

// The pids in <dir>/<name> for each name, once all exist; empty after kDeadline.
std::vector<pid_t> wait_for_pids(const TempDir& dir, const std::vector<std::string>& names) {
  const Clock::time_point deadline = Clock::now() + kDeadline;
  while (Clock::now() < deadline) {
    std::vector<pid_t> pids;
    for (const std::string& name : names) {
      std::ifstream file(dir.path() + "/" + name);
      pid_t pid = 0;
      if (file >> pid && pid > 0) {
        pids.push_back(pid);
      }
    }
    if (pids.size() == names.size()) {
      return pids;
    }
    std::this_thread::sleep_for(10ms);
  }
  ADD_FAILURE() << "the ranks did not write their pid files within " << kDeadline.count() << " ms";
  return {};
}

// Whether `pid` is a live process (a zombie is not).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) {
    return errno != ESRCH;
  }
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string contents((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = contents.rfind(')');
  return paren == std::string::npos || paren + 2 >= contents.size() || contents[paren + 2] != 'Z';
}

// Checks that none of `pids` is alive, and kills those that are, so that a
// failing test leaves no process behind.
void expect_gone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    EXPECT_FALSE(process_alive(pid)) << "process " << pid << " outlived ddprun";
    if (process_alive(pid)) {
      ::kill(pid, SIGKILL);
    }
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The lines of `text` that ddprun relayed from ranks (not its own "ddprun: ").
std::vector<std::string> rank_lines(const std::string& text) {
  std::vector<std::string> lines = lines_of(text);
  lines.erase(std::remove_if(lines.begin(), lines.end(),
                             [](const std::string& l) { return l.rfind("ddprun: ", 0) == 0; }),
              lines.end());
  return lines;
}

const char* const kPrintEnv =
    "echo \"RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK"
    " LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR"
    " MASTER_PORT=$MASTER_PORT OMP_NUM_THREADS=$OMP_NUM_THREADS\"";

// ---- Environment --------------------------------------------------------------

TEST(DdprunTest, GivesEachRankItsEnvironment) {
  Outcome outcome = run_ddprun({"--nproc-per-node", "3", "/bin/sh", "-c", kPrintEnv});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);

  std::vector<std::string> lines = rank_lines(outcome.out);
  ASSERT_EQ(lines.size(), 3u) << describe(outcome);
  // The port ddprun picked: the same for every rank.
  const std::string marker = "MASTER_PORT=";
  const size_t at = lines[0].find(marker);
  ASSERT_NE(at, std::string::npos) << describe(outcome);
  const std::string port =
      lines[0].substr(at + marker.size(), lines[0].find(' ', at) - at - marker.size());
  EXPECT_GT(std::atoi(port.c_str()), 0) << describe(outcome);

  std::set<std::string> expected;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    expected.insert("[rank " + r + "]: RANK=" + r + " WORLD_SIZE=3 LOCAL_RANK=" + r +
                    " LOCAL_WORLD_SIZE=3 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                    port + " OMP_NUM_THREADS=1");
  }
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()), expected) << describe(outcome);
  // The one note about OMP_NUM_THREADS.
  EXPECT_EQ(lines_of(outcome.err).size(), 1u) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: setting OMP_NUM_THREADS=1")) << describe(outcome);
}

TEST(DdprunTest, GivesTheRanksOfTheSecondNodeTheirEnvironment) {
  Outcome outcome =
      run_ddprun({"--nnodes", "2", "--node_rank", "1", "--nproc-per-node", "2", "--master-addr",
                  "10.9.8.7", "--master-port=29512", "/bin/sh", "-c", kPrintEnv});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
  std::vector<std::string> lines = rank_lines(outcome.out);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{
                "[rank 2]: RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 "
                "MASTER_ADDR=10.9.8.7 MASTER_PORT=29512 OMP_NUM_THREADS=1",
                "[rank 3]: RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 "
                "MASTER_ADDR=10.9.8.7 MASTER_PORT=29512 OMP_NUM_THREADS=1",
            }))
      << describe(outcome);
}

TEST(DdprunTest, KeepsTheUsersOmpNumThreads) {
  Outcome outcome = run_ddprun(
      {"--nproc-per-node", "2", "/bin/sh", "-c", "echo \"OMP=$OMP_NUM_THREADS\""},
      {{"OMP_NUM_THREADS", "4"}});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
  std::vector<std::string> lines = rank_lines(outcome.out);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"[rank 0]: OMP=4", "[rank 1]: OMP=4"}))
      << describe(outcome);
  EXPECT_EQ(outcome.err, "") << describe(outcome);

  // One rank does not oversubscribe anything: no OMP_NUM_THREADS, no note.
  outcome = run_ddprun({"--nproc-per-node", "1", "/bin/sh", "-c", "echo \"OMP=$OMP_NUM_THREADS\""});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
  EXPECT_EQ(outcome.out, "[rank 0]: OMP=\n") << describe(outcome);
  EXPECT_EQ(outcome.err, "") << describe(outcome);
}

// ---- Output -------------------------------------------------------------------

TEST(DdprunTest, RelaysEveryLineOfEveryRankWithItsPrefix) {
  constexpr int kRanks = 4;
  constexpr int kLines = 1000;
  // 777-byte writes cut lines in the middle, on both streams, all ranks at once.
  Outcome outcome = run_ddprun({"--nproc-per-node", std::to_string(kRanks),
                                DDPRUN_TEST_WRITER_PATH, std::to_string(kLines), "777"});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome).substr(0, 4000);

  for (const auto& [stream, text] : {std::pair{"out", &outcome.out}, std::pair{"err", &outcome.err}}) {
    SCOPED_TRACE(stream);
    std::map<int, int> next_line; // rank -> the line number expected next
    for (const std::string& line : rank_lines(*text)) {
      int rank = -1;
      int prefix_length = 0;
      ASSERT_EQ(std::sscanf(line.c_str(), "[rank %d]: %n", &rank, &prefix_length), 1) << line;
      ASSERT_GT(prefix_length, 0) << line;
      ASSERT_TRUE(rank >= 0 && rank < kRanks) << line;
      const int i = next_line[rank]++;
      std::string expected = std::string(stream) + " " + std::to_string(rank) + " " +
                             std::to_string(i);
      if (std::string(stream) == "out") {
        expected += " " + std::string(static_cast<size_t>(i % 191), 'x');
      }
      ASSERT_EQ(line.substr(static_cast<size_t>(prefix_length)), expected);
    }
    for (int rank = 0; rank < kRanks; ++rank) {
      EXPECT_EQ(next_line[rank], kLines) << "rank " << rank;
    }
  }
}

TEST(DdprunTest, KeepsStdoutAndStderrApart) {
  Outcome outcome = run_ddprun(
      {"--nproc-per-node", "1", "/bin/sh", "-c", "echo to-out; echo to-err >&2; echo more-out"});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
  EXPECT_EQ(outcome.out, "[rank 0]: to-out\n[rank 0]: more-out\n") << describe(outcome);
  EXPECT_EQ(outcome.err, "[rank 0]: to-err\n") << describe(outcome);
}

TEST(DdprunTest, JoinsPartialWritesAndFlushesTheLastPartialLine) {
  Outcome outcome = run_ddprun(
      {"--nproc-per-node", "2", "/bin/sh", "-c",
       "printf 'start-'; sleep 0.1; echo \"end $RANK\"; printf \"tail $RANK\""});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
  std::vector<std::string> lines = rank_lines(outcome.out);
  EXPECT_EQ(std::multiset<std::string>(lines.begin(), lines.end()),
            (std::multiset<std::string>{"[rank 0]: start-end 0", "[rank 0]: tail 0",
                                        "[rank 1]: start-end 1", "[rank 1]: tail 1"}))
      << describe(outcome);
}

TEST(DdprunTest, NoPrefixPassesOutputThrough) {
  const Args command = {"/bin/sh", "-c", "echo \"hello $RANK\"; echo \"oops $RANK\" >&2"};
  Args with_flag = {"--nproc-per-node", "2", "--no-prefix"};
  with_flag.insert(with_flag.end(), command.begin(), command.end());
  Args without_flag = {"--nproc-per-node", "2"};
  without_flag.insert(without_flag.end(), command.begin(), command.end());

  for (const Outcome& outcome : {run_ddprun(with_flag), run_ddprun(without_flag, {{"DDPRUN_NO_PREFIX", "1"}})}) {
    ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
    std::vector<std::string> out = lines_of(outcome.out);
    std::vector<std::string> err = rank_lines(outcome.err);
    EXPECT_EQ(std::set<std::string>(out.begin(), out.end()),
              (std::set<std::string>{"hello 0", "hello 1"}))
        << describe(outcome);
    EXPECT_EQ(std::set<std::string>(err.begin(), err.end()),
              (std::set<std::string>{"oops 0", "oops 1"}))
        << describe(outcome);
  }
}

// ---- Success and failure ------------------------------------------------------

TEST(DdprunTest, WaitsForEveryRankWhenTheyAllSucceed) {
  // Rank 0 finishes first; that must not stop rank 1.
  Outcome outcome =
      run_ddprun({"--nproc-per-node", "2", "/bin/sh", "-c",
                  "if [ \"$RANK\" = 1 ]; then sleep 0.3; echo still-here; fi; exit 0"});
  EXPECT_EQ(outcome.exit_code, 0) << describe(outcome);
  EXPECT_TRUE(contains(outcome.out, "[rank 1]: still-here\n")) << describe(outcome);
}

TEST(DdprunTest, FailingRankStopsTheOthers) {
  TempDir dir;
  // Rank 1 fails once the others run; they would sleep for a minute.
  const std::string script = write_pid_file(dir, "pid.$RANK") +
      "if [ \"$RANK\" = 1 ]; then " + wait_for_file(dir, "pid.0") + wait_for_file(dir, "pid.2") +
      "echo 'giving up' >&2; exit 3; fi; exec sleep 60";
  Ddprun ddprun({"--nproc-per-node", "3", "/bin/sh", "-c", script});
  Outcome outcome = ddprun.wait();
  std::vector<pid_t> pids = wait_for_pids(dir, {"pid.0", "pid.1", "pid.2"});
  ASSERT_EQ(pids.size(), 3u);

  EXPECT_EQ(outcome.exit_code, 3) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "[rank 1]: giving up\n")) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: rank 1 (pid " + std::to_string(pids[1]) +
                                        ") exited with code 3; stopping the other 2 ranks\n"))
      << describe(outcome);
  // The rank's last words come before ddprun's verdict on it.
  EXPECT_LT(outcome.err.find("giving up"), outcome.err.find("exited with code 3"))
      << describe(outcome);
  expect_gone(pids);
}

// Note [Dumps at teardown]: a rank that catches SIGUSR1 (as ddp's flight
// recorder does) is sent it, and given half a second, before SIGTERM.
TEST(DdprunTest, AsksRanksThatCatchSigusr1ForTheirDumpsBeforeStoppingThem) {
  TempDir dir;
  // sh runs a trap once the foreground command ends: short sleeps.
  const std::string script = "if [ \"$RANK\" = 1 ]; then " + wait_for_file(dir, "pid.0") +
      "exit 3; fi; trap 'echo dump-asked' USR1; trap 'echo terminated; exit 0' TERM; " +
      write_pid_file(dir, "pid.0") + "while :; do sleep 0.05; done";
  Outcome outcome = run_ddprun({"--nproc-per-node", "2", "/bin/sh", "-c", script},
                               {{"DDP_FLIGHT_RECORDER_DIR", dir.path()}});
  EXPECT_EQ(outcome.exit_code, 3) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: asked rank(s) 0 for their flight recorder dumps (SIGUSR1; "
                                    "`ddprun --analyze " + dir.path() + "` reads them); stopping in 0.5 s\n"))
      << describe(outcome);
  const auto asked = outcome.out.find("[rank 0]: dump-asked\n");
  const auto terminated = outcome.out.find("[rank 0]: terminated\n");
  EXPECT_NE(asked, std::string::npos) << describe(outcome);
  EXPECT_NE(terminated, std::string::npos) << describe(outcome);
  EXPECT_LT(asked, terminated) << describe(outcome);
}

// A rank that does not catch SIGUSR1 is not sent it: it would die of it.
TEST(DdprunTest, DoesNotSendSigusr1ToARankThatDoesNotCatchIt) {
  Outcome outcome = run_ddprun({"--nproc-per-node", "2", "/bin/sh", "-c",
                                "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 60"});
  EXPECT_EQ(outcome.exit_code, 3) << describe(outcome);
  EXPECT_FALSE(contains(outcome.err, "flight recorder dumps")) << describe(outcome);
}

// A stopped rank (SIGSTOP) is continued after the stop signal, so that it
// ends then rather than at SIGKILL after the grace period.
TEST(DdprunTest, ContinuesAStoppedRankSoThatItStops) {
  TempDir dir;
  const std::string script = "if [ \"$RANK\" = 1 ]; then " + wait_for_file(dir, "pid.0") +
      "sleep 0.2; exit 3; fi; " + write_pid_file(dir, "pid.0") + "kill -STOP $$; exec sleep 60";
  Outcome outcome =
      run_ddprun({"--nproc-per-node", "2", "--grace-period", "30", "/bin/sh", "-c", script});
  EXPECT_EQ(outcome.exit_code, 3) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  EXPECT_FALSE(contains(outcome.err, "sending SIGKILL")) << describe(outcome);
}

TEST(DdprunTest, NamesTheSignalThatKilledARank) {
  Outcome outcome = run_ddprun({"--nproc-per-node", "2", "/bin/sh", "-c",
                                "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(outcome.exit_code, 128 + SIGKILL) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: rank 1 (pid ")) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, ") was killed by signal 9 (SIGKILL); stopping the other rank\n"))
      << describe(outcome);
}

TEST(DdprunTest, KillsARankThatIgnoresSigtermAfterTheGracePeriod) {
  TempDir dir;
  const std::string script = "if [ \"$RANK\" = 0 ]; then " + wait_for_file(dir, "pid.1") +
      "exit 1; fi; trap '' TERM; " + write_pid_file(dir, "pid.1") + "exec sleep 60";
  Outcome outcome =
      run_ddprun({"--nproc-per-node", "2", "--grace-period", "1", "/bin/sh", "-c", script});
  std::vector<pid_t> pids = wait_for_pids(dir, {"pid.1"});
  ASSERT_EQ(pids.size(), 1u);

  EXPECT_EQ(outcome.exit_code, 1) << describe(outcome);
  EXPECT_GE(outcome.elapsed, 900ms) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: rank 0 (pid ")) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: rank 1 (pid " + std::to_string(pids[0]) +
                                        ") is still running 1 s after SIGTERM; sending SIGKILL\n"))
      << describe(outcome);
  expect_gone(pids);
}

TEST(DdprunTest, StopReachesTheChildrenOfARank) {
  TempDir dir;
  // Rank 0 leaves the sleeping to a child of its own; rank 1 then fails.
  const std::string script = "if [ \"$RANK\" = 1 ]; then " + wait_for_file(dir, "child") +
      "exit 5; fi; sleep 60 & " + write_pid_file(dir, "child", "$!") + "wait";
  Outcome outcome = run_ddprun({"--nproc-per-node", "2", "/bin/sh", "-c", script});
  std::vector<pid_t> pids = wait_for_pids(dir, {"child"});
  ASSERT_EQ(pids.size(), 1u);
  EXPECT_EQ(outcome.exit_code, 5) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  expect_gone(pids);
}

// ---- Signals to ddprun --------------------------------------------------------

TEST(DdprunTest, SigtermStopsEveryRank) {
  TempDir dir;
  Ddprun ddprun({"--nproc-per-node", "3", "/bin/sh", "-c",
                 write_pid_file(dir, "pid.$RANK") + "exec sleep 60"});
  std::vector<pid_t> pids = wait_for_pids(dir, {"pid.0", "pid.1", "pid.2"});
  ASSERT_EQ(pids.size(), 3u);
  for (pid_t pid : pids) {
    EXPECT_TRUE(process_alive(pid));
  }
  ASSERT_EQ(::kill(ddprun.pid(), SIGTERM), 0);
  Outcome outcome = ddprun.wait();

  EXPECT_EQ(outcome.exit_code, 128 + SIGTERM) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: received SIGTERM; sending it to the 3 running ranks"))
      << describe(outcome);
  expect_gone(pids);
}

TEST(DdprunTest, ForwardsSigintToTheRanks) {
  TempDir dir;
  // Each rank says which signal reached it, and exits on its own.
  const std::string script = "trap 'echo got-SIGINT; exit 7' INT; " +
      write_pid_file(dir, "pid.$RANK") + "while :; do sleep 0.05; done";
  Ddprun ddprun({"--nproc-per-node", "2", "/bin/sh", "-c", script});
  std::vector<pid_t> pids = wait_for_pids(dir, {"pid.0", "pid.1"});
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(ddprun.pid(), SIGINT), 0);
  Outcome outcome = ddprun.wait();

  EXPECT_EQ(outcome.exit_code, 128 + SIGINT) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  std::vector<std::string> lines = rank_lines(outcome.out);
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"[rank 0]: got-SIGINT", "[rank 1]: got-SIGINT"}))
      << describe(outcome);
  // Ranks that exit because they were told to stop are not failures to report.
  EXPECT_FALSE(contains(outcome.err, "exited with code 7")) << describe(outcome);
  expect_gone(pids);
}

// ---- Restarts (--max-restarts) ------------------------------------------------

// Shell code that prints the attempt's view of the rendezvous.
const char* const kPrintAttempt =
    "echo \"attempt $DDP_RESTART_COUNT torchelastic $TORCHELASTIC_RESTART_COUNT"
    " port $MASTER_PORT\"; ";

// The value of "<key> <value>" in `line`, or "" when absent.
std::string field(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + " ");
  if (at == std::string::npos) {
    return "";
  }
  const size_t begin = at + key.size() + 2;
  return line.substr(begin, line.find(' ', begin) - begin);
}

TEST(DdprunTest, TellsTheRanksTheRestartCountEvenWithoutRestarts) {
  Outcome outcome = run_ddprun({"--nproc-per-node", "2", "/bin/sh", "-c", kPrintAttempt});
  ASSERT_EQ(outcome.exit_code, 0) << describe(outcome);
  for (const std::string& line : rank_lines(outcome.out)) {
    EXPECT_TRUE(contains(line, "attempt 0 torchelastic 0 port ")) << describe(outcome);
  }
}

TEST(DdprunTest, RestartsTheGroupWhenARankFails) {
  TempDir dir;
  // Attempt 0: rank 0 sleeps and rank 1 fails once it runs. Attempt 1: rank
  // 0 checks that attempt 0's rank 0 is gone, and both succeed.
  const std::string script = std::string(kPrintAttempt) +
      write_pid_file(dir, "pid.$DDP_RESTART_COUNT.$RANK") +
      "if [ \"$DDP_RESTART_COUNT\" = 0 ]; then "
      "  if [ \"$RANK\" = 1 ]; then " + wait_for_file(dir, "pid.0.0") + "exit 1; fi; "
      "  exec sleep 60; "
      "fi; "
      "if [ \"$RANK\" = 0 ] && kill -0 $(cat " + dir.path() + "/pid.0.0) 2>/dev/null; then "
      "  echo 'attempt 0 is still running'; fi; "
      "exit 0";
  Outcome outcome =
      run_ddprun({"--nproc-per-node", "2", "--max-restarts", "1", "/bin/sh", "-c", script});
  std::vector<pid_t> pids = wait_for_pids(dir, {"pid.0.0", "pid.0.1", "pid.1.0", "pid.1.1"});
  ASSERT_EQ(pids.size(), 4u);

  EXPECT_EQ(outcome.exit_code, 0) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: rank 1 (pid " + std::to_string(pids[1]) +
                                        ") exited with code 1; stopping the other rank\n"
                                        "ddprun: rank 1 exited with code 1; restarting the group "
                                        "(restart 1 of 1)\n"))
      << describe(outcome);
  EXPECT_FALSE(contains(outcome.out, "still running")) << describe(outcome);
  // The note on OMP_NUM_THREADS comes once, not once per attempt.
  EXPECT_EQ(outcome.err.find("ddprun: setting OMP_NUM_THREADS"),
            outcome.err.rfind("ddprun: setting OMP_NUM_THREADS"))
      << describe(outcome);

  // Both attempts, each with its own count and a port of its own.
  std::map<std::string, std::set<std::string>> ports; // attempt -> ports its ranks saw
  std::multiset<std::string> seen;
  for (const std::string& line : rank_lines(outcome.out)) {
    seen.insert(line.substr(0, line.find(" port ")));
    ports[field(line, "attempt")].insert(field(line, "port"));
  }
  EXPECT_EQ(seen, (std::multiset<std::string>{"[rank 0]: attempt 0 torchelastic 0",
                                              "[rank 1]: attempt 0 torchelastic 0",
                                              "[rank 0]: attempt 1 torchelastic 1",
                                              "[rank 1]: attempt 1 torchelastic 1"}))
      << describe(outcome);
  ASSERT_EQ(ports["0"].size(), 1u) << describe(outcome);
  ASSERT_EQ(ports["1"].size(), 1u) << describe(outcome);
  EXPECT_NE(*ports["0"].begin(), *ports["1"].begin())
      << "the restart reused the port: " << describe(outcome);
  expect_gone(pids);
}

TEST(DdprunTest, GivesUpWhenTheRestartsAreUsed) {
  TempDir dir;
  // Rank 1 fails in every attempt, once rank 0 of the same attempt has printed.
  Outcome outcome = run_ddprun(
      {"--nproc-per-node", "2", "--max-restarts", "2", "/bin/sh", "-c",
       std::string(kPrintAttempt) + write_pid_file(dir, "pid.$DDP_RESTART_COUNT.$RANK") +
           "if [ \"$RANK\" = 1 ]; then " + wait_for_file(dir, "pid.$DDP_RESTART_COUNT.0") +
           "exit 4; fi; exec sleep 60"});
  EXPECT_EQ(outcome.exit_code, 4) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  for (const char* line :
       {"ddprun: rank 1 exited with code 4; restarting the group (restart 1 of 2)\n",
        "ddprun: rank 1 exited with code 4; restarting the group (restart 2 of 2)\n",
        "ddprun: rank 1 exited with code 4; not restarting: all 2 restart(s) used "
        "(--max-restarts 2)\n"}) {
    EXPECT_TRUE(contains(outcome.err, line)) << line << "\n" << describe(outcome);
  }
  std::vector<std::string> lines = rank_lines(outcome.out);
  std::multiset<std::string> attempts;
  for (const std::string& line : lines) {
    attempts.insert(line.substr(0, line.find(" torchelastic")));
  }
  EXPECT_EQ(attempts, (std::multiset<std::string>{
                          "[rank 0]: attempt 0", "[rank 1]: attempt 0", "[rank 0]: attempt 1",
                          "[rank 1]: attempt 1", "[rank 0]: attempt 2", "[rank 1]: attempt 2"}))
      << describe(outcome);
}

TEST(DdprunTest, RestartOnAFixedPortWaitsUntilTheOldAttemptLetsGoOfIt) {
  // A port that was free a moment ago, given with --master-port as on
  // several nodes: the restart must reuse it, once every process of the old
  // attempt (rank 0 and its child, both ignoring SIGTERM) is gone.
  int port = 0;
  {
    UniqueFd probe(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    ASSERT_EQ(::bind(probe.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ASSERT_EQ(::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
    port = ntohs(address.sin_port);
  }
  const std::string p = std::to_string(port);
  Outcome outcome =
      run_ddprun({"--nproc-per-node", "2", "--master-port", p, "--max-restarts", "1",
                  "--grace-period", "0.5", DDPRUN_TEST_PORT_RANK_PATH, "1"});
  EXPECT_EQ(outcome.exit_code, 0) << describe(outcome);
  EXPECT_LT(outcome.elapsed, kPromptly) << describe(outcome);
  std::vector<std::string> lines = rank_lines(outcome.out);
  EXPECT_EQ(std::multiset<std::string>(lines.begin(), lines.end()),
            (std::multiset<std::string>{"[rank 0]: attempt 0: rank 0 listening on port " + p,
                                        "[rank 1]: attempt 0: rank 1 connected to port " + p,
                                        "[rank 0]: attempt 1: rank 0 listening on port " + p,
                                        "[rank 1]: attempt 1: rank 1 connected to port " + p}))
      << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "ddprun: rank 1 exited with code 1; restarting the group "
                                    "(restart 1 of 1)\n"))
      << describe(outcome);
}

TEST(DdprunTest, AStopSignalIsNotARestart) {
  TempDir dir;
  Ddprun ddprun({"--nproc-per-node", "2", "--max-restarts", "3", "/bin/sh", "-c",
                 write_pid_file(dir, "pid.$DDP_RESTART_COUNT.$RANK") + "exec sleep 60"});
  std::vector<pid_t> pids = wait_for_pids(dir, {"pid.0.0", "pid.0.1"});
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(ddprun.pid(), SIGTERM), 0);
  Outcome outcome = ddprun.wait();
  EXPECT_EQ(outcome.exit_code, 128 + SIGTERM) << describe(outcome);
  EXPECT_FALSE(contains(outcome.err, "restart")) << describe(outcome);
  expect_gone(pids);
}

// ---- Bad command lines --------------------------------------------------------

TEST(DdprunTest, MissingProgramIsNamed) {
  for (const std::string program : {"/nonexistent/ddprun-test-program", "ddprun-test-no-such-program"}) {
    Outcome outcome = run_ddprun({"--nproc-per-node", "2", program});
    EXPECT_EQ(outcome.exit_code, 127) << describe(outcome);
    EXPECT_TRUE(contains(outcome.err, "ddprun: cannot run '" + program +
                                          "': No such file or directory"))
        << describe(outcome);
    EXPECT_TRUE(contains(outcome.err, "exited with code 127")) << describe(outcome);
  }
}

TEST(DdprunTest, HelpGoesToStdout) {
  Outcome outcome = run_ddprun({"--help"});
  EXPECT_EQ(outcome.exit_code, 0) << describe(outcome);
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                           "--master-port", "--grace-period", "--max-restarts", "--no-prefix",
                           "DDPRUN_NO_PREFIX", "DDP_RESTART_COUNT"}) {
    EXPECT_TRUE(contains(outcome.out, flag)) << flag;
  }
  EXPECT_EQ(outcome.err, "");
}

struct BadFlags {
  Args args;
  std::string expected; // in ddprun's error
};

void PrintTo(const BadFlags& bad, std::ostream* os) {
  *os << ::testing::PrintToString(bad.args);
}

class DdprunBadFlagsTest : public ::testing::TestWithParam<BadFlags> {};

TEST_P(DdprunBadFlagsTest, ExitsTwoWithUsage) {
  Outcome outcome = run_ddprun(GetParam().args);
  EXPECT_EQ(outcome.exit_code, 2) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, GetParam().expected)) << describe(outcome);
  EXPECT_TRUE(contains(outcome.err, "usage: ddprun")) << describe(outcome);
  EXPECT_EQ(outcome.out, "") << describe(outcome);
}

INSTANTIATE_TEST_SUITE_P(
    DdprunTest,
    DdprunBadFlagsTest,
    ::testing::Values(
        BadFlags{{"--nproc-per-node", "1", "--frobnicate", "true"}, "unknown option '--frobnicate'"},
        BadFlags{{"--nproc-per-node", "zero", "true"}, "(got 'zero')"},
        BadFlags{{"--nproc-per-node", "0", "true"}, "(got '0')"},
        BadFlags{{"true"}, "--nproc-per-node is required"},
        BadFlags{{"--nproc-per-node", "2"}, "missing the program"},
        BadFlags{{"--nproc-per-node", "1", "--nnodes", "2", "true"}, "--master-port is required"},
        BadFlags{{"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "5", "--master-port",
                  "29500", "true"},
                 "--node-rank 5 with --nnodes 2"},
        BadFlags{{"--nproc-per-node", "1", "--grace-period", "-1", "true"}, "(got '-1')"},
        BadFlags{{"--nproc-per-node", "1", "--max-restarts", "-1", "true"}, "(got '-1')"},
        BadFlags{{"--nproc-per-node", "1", "--nnodes", "2", "--master-port", "29500",
                  "--max-restarts", "1", "true"},
                 "--max-restarts needs --nnodes 1"}));

} // namespace
} // namespace ddp::launch
