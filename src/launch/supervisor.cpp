// How it works
//
// ddprun is one thread around one poll() loop. Each rank is a child process,
// forked and exec'd in a process group of its own, whose stdout and stderr are
// pipes that the loop reads. The bytes are cut into lines (LineSplitter) and
// written whole to ddprun's own stdout or stderr, so that the lines of
// different ranks never mix.
//
// Signals reach the loop through a self-pipe: the handler only writes the
// signal number into the pipe, which the loop polls beside the output pipes,
// so all the work is done in the loop. SIGCHLD makes the loop reap with
// waitpid(-1, WNOHANG). On Linux ddprun is a child subreaper: descendants that
// a rank leaves behind become ddprun's children, and are reaped too.
//
// The stop: the first rank that fails (exits non-zero or dies by a signal),
// or the first stop signal ddprun receives (SIGINT, SIGTERM, SIGHUP, SIGQUIT),
// first asks the running ranks for their flight recorder dumps and gives them
// kDumpWindow to write them (Note [Dumps at teardown] in teardown_dumps.cpp),
// then sends a signal to the process group of every rank still running, and
// of the failed rank (SIGTERM after a failure, the received signal
// otherwise), then SIGCONT (a stopped group handles the signal only once
// continued), and sets the kill deadline to now + the grace period. At the deadline, every stopped group that still
// has processes gets SIGKILL. A second stop signal during a stop kills at once.
// The ranks that exit during a stop are expected casualties and are not
// reported.
//
// The loop ends when every rank is reaped, its pipes are at EOF and, during a
// stop, the stopped process groups are empty (or have been sent SIGKILL). A rank's descendant may hold a
// pipe open after the rank exited; such pipes get kDrainTimeout to close.
//
// Restarts (--max-restarts N): one Supervisor runs one attempt of the job,
// from the start of the ranks to the end of a stop. When an attempt ends
// because a rank failed (not because ddprun was asked to stop) and restarts
// are left, run_ranks waits until the stopped process groups are empty, so
// that nothing of the old attempt holds the port or the old store, and
// starts a new attempt with a new rendezvous: a free port picked afresh
// (unless --master-port fixed it, which is free again by then), hence a new
// store served by the new rank 0. Each rank is told the attempt's number in
// TORCHELASTIC_RESTART_COUNT and DDP_RESTART_COUNT, and resumes from its
// last checkpoint. The signal router lives across attempts, so a stop signal
// that comes between two attempts stops the job instead of starting the next.
//
// Note [Process groups]: each rank calls setpgid(0, 0) and ddprun calls
// setpgid(pid, pid) too, so that the group exists before either goes on. A
// stop signals the group (kill(-pgid)) rather than the pid, so that the rank's
// own children (data loader workers, a shell's command) stop with it. It also
// keeps the ranks out of the terminal's foreground group: Ctrl-C reaches
// ddprun alone, which forwards it once, instead of every process at once.

#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flight_recorder/dump_directory.h"
#include "launch/readers/launcher_account.h"
#include "launch/child_process.h"
#include "launch/output.h"
#include "launch/teardown_dumps.h"
#include "launch/unique_fd.h"

extern char** environ; // POSIX declares it in no header.

namespace ddp::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long pipes still held open by a finished rank's descendants are read
// before ddprun gives up on them and exits.
constexpr milliseconds kDrainTimeout{2000};
// How often a stop checks whether the stopped process groups are empty (no
// event announces it: their members are not our children).
constexpr milliseconds kGroupPollInterval{20};
// How long a restart waits for the processes of the stopped attempt to be
// gone (they were sent SIGKILL, or exited on SIGTERM) before it starts anyway.
constexpr milliseconds kRestartWaitTimeout{5000};
// The loop wakes at least this often, whatever it waits for.
constexpr milliseconds kMaxPollWait{500};
constexpr size_t kReadChunkBytes = 64 * 1024;

std::string format_seconds(milliseconds duration) {
  std::ostringstream out;
  out << static_cast<double>(duration.count()) / 1000 << " s";
  return out.str();
}

// "the other rank", "the other 3 ranks".
std::string other_ranks(int count) {
  return count == 1 ? "the other rank" : "the other " + std::to_string(count) + " ranks";
}

// One child stream (stdout or stderr of a rank) on its way to ddprun's.
struct Stream {
  UniqueFd fd; // read end of the child's pipe; empty once at EOF
  LineSplitter lines;
  // Non-owning: points at a sink of the Supervisor, which outlives its ranks.
  OutputSink* sink = nullptr;
};

struct Rank {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1; // also its process group id; see Note [Process groups]
  bool running = false; // started and not yet reaped
  bool in_stop = false; // its process group was sent the stop signal
  Stream out;
  Stream err;
};

enum class Phase {
  kRunning, // no rank has failed, no stop signal has come
  kDumping, // the ranks were asked for their dumps; the stop signal at dump_deadline_
  kStopping, // the stop signal was sent; SIGKILL at kill_deadline_
  kKilled, // SIGKILL was sent; waiting for the ranks to be reaped
};

// Runs one attempt of the job: starts the ranks, relays their output, stops
// them. Thread-safety: none; used by the main thread only (see run_ranks).
class Supervisor {
 public:
  // `options.master_port` is set. `signals` outlives the Supervisor.
  Supervisor(const LaunchOptions& options, int restart_count, SignalRouter& signals)
      : options_(options), restart_count_(restart_count), signals_(signals) {
    dev_null_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!dev_null_.valid()) {
      throw std::runtime_error(std::string("cannot open /dev/null: ") + std::strerror(errno));
    }
#ifdef __linux__
    // Orphaned descendants of the ranks become our children rather than
    // init's, so that we reap them: a zombie still counts as a member of its
    // process group, and init in a container often reaps nothing.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
  }

  int run() {
    handle_signals(); // one that came between two attempts stops the job
    if (phase_ == Phase::kRunning) {
      start_all();
    }
    while (true) {
      handle_signals();
      reap();
      const Clock::time_point now = Clock::now();
      if (phase_ == Phase::kDumping && (now >= dump_deadline_ || running_count() == 0)) {
        send_stop();
      }
      if (phase_ == Phase::kStopping && now >= kill_deadline_) {
        report_survivors();
        kill_all();
      }
      if (finished(now)) {
        break;
      }
      poll_and_read(now);
    }
    for (Rank& rank : ranks_) {
      close_stream(rank.out);
      close_stream(rank.err);
    }
    return exit_code_.value_or(0);
  }

  // Whether the attempt ended because a rank failed, and ddprun was not
  // asked to stop: the case for a restart.
  bool ended_by_rank_failure() const {
    return failure_.has_value() && !stop_requested_;
  }

  // "rank 1 exited with code 3", once a rank has failed.
  const std::optional<std::string>& failure() const {
    return failure_;
  }

  // Waits until the process groups of the stopped ranks are empty, reaping
  // as a subreaper must; gives up at `deadline` and says which group still
  // has processes. Before a restart, so that nothing of this attempt holds
  // the port or talks to the old store when the next one starts.
  void wait_for_stopped_groups(Clock::time_point deadline) {
    while (true) {
      reap();
      const bool any_alive = std::any_of(ranks_.begin(), ranks_.end(),
                                         [](const Rank& r) { return r.in_stop && group_alive(r); });
      if (!any_alive) {
        return;
      }
      if (Clock::now() >= deadline) {
        for (const Rank& rank : ranks_) {
          if (rank.in_stop && group_alive(rank)) {
            ::kill(-rank.pid, SIGKILL);
            message("processes of rank " + std::to_string(rank.rank) + " (process group " +
                    std::to_string(rank.pid) + ") are still running after SIGKILL; restarting "
                    "without waiting for them");
          }
        }
        return;
      }
      ::poll(nullptr, 0, static_cast<int>(kGroupPollInterval.count()));
    }
  }

 private:
  void message(const std::string& text) { stderr_sink_.write("ddprun: " + text + "\n"); }

  int running_count() const {
    return static_cast<int>(
        std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
  }

  void start_all() {
    const char* inherited_omp = std::getenv("OMP_NUM_THREADS");
    if (options_.nproc_per_node > 1 && inherited_omp == nullptr && restart_count_ == 0) {
      message("setting OMP_NUM_THREADS=1 for each rank so that " +
              std::to_string(options_.nproc_per_node) +
              " ranks do not overload the CPU; set OMP_NUM_THREADS yourself to tune it");
    }
    ranks_.resize(static_cast<size_t>(options_.nproc_per_node));
    for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank) {
      Rank& rank = ranks_[static_cast<size_t>(local_rank)];
      rank.local_rank = local_rank;
      rank.rank = options_.node_rank * options_.nproc_per_node + local_rank;
      try {
        spawn(rank, inherited_omp);
      } catch (const std::exception& e) {
        exit_code_ = 1;
        const int started = running_count();
        message(std::string(e.what()) +
                (started > 0 ? "; stopping the " + std::to_string(started) + " ranks started" : ""));
        begin_stop(SIGTERM, nullptr);
        break;
      }
    }
  }

  void spawn(Rank& rank, const char* inherited_omp) {
    const std::string prefix =
        options_.prefix_output ? "[rank " + std::to_string(rank.rank) + "]: " : "";
    rank.out.lines = LineSplitter(prefix);
    rank.out.sink = &stdout_sink_;
    rank.err.lines = LineSplitter(prefix);
    rank.err.sink = &stderr_sink_;

    // ddprun's environment with the rank's variables put over it.
    auto overrides = rank_environment(options_, rank.local_rank, inherited_omp);
    for (auto& variable : restart_environment(restart_count_)) {
      overrides.push_back(std::move(variable));
    }
    std::vector<std::string> env;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string_view text(*entry);
      const std::string_view name = text.substr(0, text.find('='));
      const bool overridden = std::any_of(overrides.begin(), overrides.end(),
                                          [&](const auto& kv) { return kv.first == name; });
      if (!overridden) {
        env.emplace_back(text);
      }
    }
    for (const auto& [name, value] : overrides) {
      env.push_back(name + "=" + value);
    }
    std::vector<char*> envp;
    for (std::string& entry : env) {
      envp.push_back(entry.data());
    }
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const std::string& arg : options_.program) {
      argv.push_back(const_cast<char*>(arg.c_str()));
    }
    argv.push_back(nullptr);

    // Our read ends are non-blocking for the poll loop; the child's write ends
    // stay blocking, as a program expects of its stdout.
    auto [out_read, out_write] = make_pipe();
    auto [err_read, err_write] = make_pipe();
    set_nonblocking(out_read);
    set_nonblocking(err_read);

    ChildSetup setup{};
    setup.parent = ::getpid();
    setup.stdin_fd = dev_null_.get();
    setup.stdout_fd = out_write.get();
    setup.stderr_fd = err_write.get();
    setup.argv = argv.data();
    setup.envp = envp.data();
    setup.signals = &signals_;
    sigset_t previous_mask;
    ::sigprocmask(SIG_BLOCK, &signals_.routed(), &previous_mask);
    const pid_t pid = ::fork();
    if (pid == 0) {
      exec_child(setup);
    }
    const int fork_error = errno;
    ::sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
    if (pid < 0) {
      throw std::runtime_error("cannot start rank " + std::to_string(rank.rank) +
                               ": fork failed: " + std::strerror(fork_error));
    }
    ::setpgid(pid, pid); // See Note [Process groups].
    rank.pid = pid;
    rank.running = true;
    rank.out.fd = std::move(out_read);
    rank.err.fd = std::move(err_read);
    // The write ends close as this returns, so that EOF comes once the rank
    // and its descendants have closed theirs.
  }

  void handle_signals() {
    for (int signal_number : signals_.take()) {
      if (signal_number == SIGCHLD) {
        continue; // reap() runs on every turn of the loop
      }
      const std::string name = signal_name(signal_number);
      stop_requested_ = true;
      if (phase_ == Phase::kRunning) {
        exit_code_ = 128 + signal_number;
        const int running = running_count();
        message("received " + name + "; " +
                (running > 0 ? "sending it to the " + std::to_string(running) +
                                   " running ranks, SIGKILL in " +
                                   format_seconds(options_.grace_period)
                             : "no rank is running"));
        begin_stop(signal_number, nullptr);
      } else if (phase_ == Phase::kDumping || phase_ == Phase::kStopping) {
        message("received " + name + " again; sending SIGKILL to the ranks");
        kill_all();
      }
    }
  }

  // Reaps every child that has exited: the ranks, and (as a subreaper) the
  // orphaned descendants of ranks, which need no more than that.
  void reap() {
    while (true) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR) {
        continue;
      }
      if (pid <= 0) {
        return; // none has exited (0), or no child is left (ECHILD)
      }
      for (Rank& rank : ranks_) {
        if (rank.running && rank.pid == pid) {
          rank.running = false;
          on_rank_exit(rank, status);
          break;
        }
      }
    }
  }

  void on_rank_exit(Rank& rank, int status) {
    if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || phase_ != Phase::kRunning) {
      return;
    }
    // The rank's last words are in its pipes now; print them before our verdict.
    while (read_stream(rank.out)) {
    }
    while (read_stream(rank.err)) {
    }

    std::string what;
    if (WIFEXITED(status)) {
      exit_code_ = WEXITSTATUS(status);
      what = "exited with code " + std::to_string(WEXITSTATUS(status));
    } else {
      const int signal_number = WTERMSIG(status);
      exit_code_ = 128 + signal_number;
      what = "was killed by signal " + std::to_string(signal_number) + " (" +
             signal_name(signal_number) + ")";
#ifdef WCOREDUMP
      if (WCOREDUMP(status)) {
        what += ", core dumped";
      }
#endif
    }
    failure_ = "rank " + std::to_string(rank.rank) + " " + what;
    write_account(rank, what);
    const int others = running_count();
    message("rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ") " +
            what + (others > 0 ? "; stopping " + other_ranks(others) : ""));
    begin_stop(SIGTERM, &rank);
  }

  // Writes the launcher's account of the failure of `failed` beside the
  // ranks' dumps (Note [Launcher's account]) when there are or will be
  // dumps: the folder exists (the failed rank dumped), or a running rank
  // has a flight recorder. A message, never an exception, when it cannot.
  void write_account(const Rank& failed, const std::string& what) {
    const std::string dir = dump_directory();
    struct stat info {};
    bool dumps = ::stat(dir.c_str(), &info) == 0;
    for (const Rank& rank : ranks_) {
      dumps = dumps || (rank.running && can_dump(rank.pid));
    }
    if (!dumps) {
      return;
    }
    flight_recorder::LauncherAccount account;
    account.job = flight_recorder::job_name();
    account.world_size = options_.nnodes * options_.nproc_per_node;
    account.attempt = restart_count_;
    account.first_failed = failed.rank;
    account.what = what;
    for (const Rank& rank : ranks_) {
      // A stopped rank (SIGSTOP) made the failed one time out waiting for it.
      if (rank.running && is_stopped(rank.pid)) {
        account.first_failed = rank.rank;
        account.what = "was stopped (SIGSTOP or a debugger) when rank " + std::to_string(failed.rank) + " " + what;
        break;
      }
    }
    account.at_us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    std::string error;
    if (!flight_recorder::write_launcher_account(dir, account, &error)) {
      message("could not write its account of the failure for `ddprun --analyze`: " + error);
    }
  }

  // Stops the running ranks and `failed` (whose children may outlive it):
  // asks the running ranks for their dumps first, when any can write one.
  void begin_stop(int signal_number, const Rank* failed) {
    stop_signal_ = signal_number;
    std::string asked;
    for (Rank& rank : ranks_) {
      if (rank.running || &rank == failed) {
        rank.in_stop = true;
      }
      if (rank.running && ask_for_dump(rank.pid)) {
        asked += (asked.empty() ? "" : ", ") + std::to_string(rank.rank);
      }
    }
    if (asked.empty()) {
      send_stop();
      return;
    }
    message("asked rank(s) " + asked + " for their flight recorder dumps (SIGUSR1; `ddprun --analyze " +
            dump_directory() + "` reads them); stopping in " + format_seconds(kDumpWindow));
    phase_ = Phase::kDumping;
    dump_deadline_ = Clock::now() + kDumpWindow;
  }

  // Sends the stop signal to the groups of the ranks in the stop, SIGCONT
  // after it to a group that is stopped, and starts the grace period.
  void send_stop() {
    phase_ = Phase::kStopping;
    kill_deadline_ = Clock::now() + options_.grace_period;
    for (Rank& rank : ranks_) {
      if (rank.in_stop) {
        ::kill(-rank.pid, stop_signal_); // See Note [Process groups].
        ::kill(-rank.pid, SIGCONT); // a stopped group handles the signal only once continued
      }
    }
  }

  // True while the process group of a stopped rank has members. Its id cannot
  // be reused while it has members, and a reused pid is a group id only if
  // the new process makes itself a group leader, so no stranger is signalled.
  static bool group_alive(const Rank& rank) { return ::kill(-rank.pid, 0) == 0; }

  // Names what the grace period did not stop.
  void report_survivors() {
    for (const Rank& rank : ranks_) {
      if (!rank.in_stop || !group_alive(rank)) {
        continue;
      }
      const std::string who = rank.running
          ? "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ") is"
          : "processes left by rank " + std::to_string(rank.rank) + " (process group " +
              std::to_string(rank.pid) + ") are";
      message(who + " still running " + format_seconds(options_.grace_period) + " after " +
              signal_name(stop_signal_) + "; sending SIGKILL");
    }
  }

  void kill_all() {
    phase_ = Phase::kKilled;
    for (const Rank& rank : ranks_) {
      if (rank.in_stop) {
        ::kill(-rank.pid, SIGKILL); // ESRCH when the group is empty already
      }
    }
  }

  bool finished(Clock::time_point now) {
    if (running_count() > 0) {
      return false;
    }
    if (phase_ == Phase::kStopping &&
        std::any_of(ranks_.begin(), ranks_.end(),
                    [](const Rank& r) { return r.in_stop && group_alive(r); })) {
      return false; // left-overs of the stopped ranks; SIGKILL at the deadline
    }
    const bool any_open = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) {
      return r.out.fd.valid() || r.err.fd.valid();
    });
    if (!any_open) {
      return true;
    }
    if (!drain_deadline_) {
      drain_deadline_ = now + kDrainTimeout;
    }
    return now >= *drain_deadline_;
  }

  void poll_and_read(Clock::time_point now) {
    Clock::time_point wake = now + kMaxPollWait;
    if (phase_ == Phase::kDumping) {
      wake = std::min(wake, dump_deadline_);
    }
    if (phase_ == Phase::kStopping) {
      wake = std::min(wake, kill_deadline_);
      if (running_count() == 0) {
        wake = std::min(wake, now + kGroupPollInterval);
      }
    }
    if (drain_deadline_) {
      wake = std::min(wake, *drain_deadline_);
    }
    const auto timeout = std::chrono::ceil<milliseconds>(std::max(wake - now, Clock::duration(0)));

    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<Stream*> streams{nullptr};
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (stream->fd.valid()) {
          fds.push_back({stream->fd.get(), POLLIN, 0});
          streams.push_back(stream);
        }
      }
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) {
      return; // timeout, or EINTR: the loop looks at signals and deadlines
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        read_stream(*streams[i]);
      }
    }
  }

  // Reads one chunk from `stream` and passes its complete lines on. Returns
  // true when more may be waiting.
  bool read_stream(Stream& stream) {
    if (!stream.fd.valid()) {
      return false;
    }
    ssize_t n = ::read(stream.fd.get(), buffer_.data(), buffer_.size());
    if (n > 0) {
      stream.sink->write(stream.lines.feed(std::string_view(buffer_.data(), static_cast<size_t>(n))));
      return true;
    }
    if (n < 0 && errno == EINTR) {
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return false;
    }
    close_stream(stream); // EOF, or an error that will not go away
    return false;
  }

  void close_stream(Stream& stream) {
    if (stream.fd.valid()) {
      stream.sink->write(stream.lines.finish());
      stream.fd.reset();
    }
  }

  const LaunchOptions& options_;
  const int restart_count_; // 0 for the first attempt
  // Non-owning: run_ranks' router, which outlives every attempt.
  SignalRouter& signals_;
  OutputSink stdout_sink_{STDOUT_FILENO};
  OutputSink stderr_sink_{STDERR_FILENO};
  UniqueFd dev_null_; // the ranks' stdin; see docs/launcher.md
  std::vector<Rank> ranks_;
  std::vector<char> buffer_ = std::vector<char>(kReadChunkBytes);

  Phase phase_ = Phase::kRunning;
  std::optional<int> exit_code_; // set by the first failure or stop signal
  std::optional<std::string> failure_; // the first failed rank, without its pid
  bool stop_requested_ = false; // ddprun received a stop signal
  int stop_signal_ = SIGTERM;
  Clock::time_point kill_deadline_;
  Clock::time_point dump_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
};

} // namespace

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGSYS: return "SIGSYS";
    default: return "SIG" + std::to_string(signal_number);
  }
}

int run_ranks(const LaunchOptions& options) {
  SignalRouter signals;
  OutputSink stderr_sink(STDERR_FILENO);
  for (int restart_count = 0;; ++restart_count) {
    // A new rendezvous for every attempt: a port picked afresh unless the
    // user fixed one, and a new store, served by the new rank 0.
    LaunchOptions attempt = options;
    if (!attempt.master_port) {
      attempt.master_port = pick_free_port(attempt.master_addr);
    }
    Supervisor supervisor(attempt, restart_count, signals);
    const int exit_code = supervisor.run();
    if (!supervisor.ended_by_rank_failure() || options.max_restarts == 0) {
      return exit_code;
    }
    const std::string& failure = *supervisor.failure();
    if (restart_count == options.max_restarts) {
      stderr_sink.write("ddprun: " + failure + "; not restarting: all " +
                        std::to_string(options.max_restarts) + " restart(s) used (--max-restarts " +
                        std::to_string(options.max_restarts) + ")\n");
      return exit_code;
    }
    stderr_sink.write("ddprun: " + failure + "; restarting the group (restart " +
                      std::to_string(restart_count + 1) + " of " +
                      std::to_string(options.max_restarts) + ")\n");
    supervisor.wait_for_stopped_groups(Clock::now() + kRestartWaitTimeout);
  }
}

} // namespace ddp::launch
