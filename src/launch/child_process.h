#pragma once

// ddprun's process plumbing: pipes, the signal router (signals into the poll
// loop through a self-pipe), and the forked child's way to exec a rank.

#include <signal.h>
#include <sys/types.h>

#include <utility>
#include <vector>

#include "launch/unique_fd.h"

namespace ddp::launch {

// Makes reads and writes of `fd` non-blocking.
void set_nonblocking(const UniqueFd& fd);

// A pipe, {read end, write end}, both closed on exec. Throws
// std::runtime_error when the system refuses one.
std::pair<UniqueFd, UniqueFd> make_pipe();

// Routes SIGCHLD and the stop signals (SIGTERM; SIGINT, SIGHUP, SIGQUIT
// unless ddprun started with them ignored) into a self-pipe for its
// lifetime, and ignores SIGPIPE (a reader of ddprun's output going away must
// not kill it). Restores the dispositions it found when destroyed.
// Thread-safety: one per process, created and destroyed on the main thread.
class SignalRouter {
 public:
  SignalRouter();
  SignalRouter(const SignalRouter&) = delete;
  SignalRouter& operator=(const SignalRouter&) = delete;
  ~SignalRouter();

  // The descriptor to poll for readability.
  int fd() const { return read_.get(); }

  // The signals that arrived since the last call, oldest first.
  std::vector<int> take();

  // The signals routed here; they are blocked around fork so that none is
  // handled by a child before it restores the dispositions.
  const sigset_t& routed() const { return routed_; }

  // Puts back the dispositions ddprun started with. Async-signal-safe: the
  // forked child calls it before exec, so that the rank sees the signals as
  // ddprun's parent set them (an ignored SIGPIPE stays ignored, a default
  // SIGPIPE is not turned into an ignored one).
  void restore_dispositions() const;

 private:
  struct Saved {
    int signal_number;
    struct sigaction action;
  };

  void replace(int signal_number, const struct sigaction& action);

  UniqueFd read_;
  UniqueFd write_;
  std::vector<Saved> saved_;
  sigset_t routed_;
};

// What the forked child needs, all prepared before fork so that the child
// allocates nothing. The pointers point into the parent's copy of the
// Supervisor's locals, which the child's copy of memory keeps alive.
struct ChildSetup {
  pid_t parent;
  int stdin_fd;
  int stdout_fd;
  int stderr_fd;
  char* const* argv;
  char** envp;
  const SignalRouter* signals;
};

// Runs in the forked child: a process group of its own (Note [Process
// groups] in supervisor.cpp), death with ddprun, the pipes as stdout and
// stderr, the signals as ddprun found them, then exec. Between fork and exec
// it calls only async-signal-safe functions, except strerror after a failed
// exec, which is safe because ddprun has one thread: no lock can be held
// across fork.
[[noreturn]] void exec_child(const ChildSetup& setup);

} // namespace ddp::launch
