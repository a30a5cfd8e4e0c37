// ddprun's process plumbing (launch/child_process.h).

#include "launch/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

extern char** environ; // POSIX declares it in no header.

namespace ddp::launch {
namespace {

// SIGTERM is always handled: it is how schedulers (Slurm, Kubernetes) ask a
// job to stop. The others are left ignored when ddprun starts with them
// ignored, as shells do: nohup ignores SIGHUP, and a background job in a
// script ignores SIGINT and SIGQUIT.
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

// The write end of the self-pipe while a SignalRouter exists, else -1.
volatile sig_atomic_t g_wake_fd = -1;

void on_signal(int signal_number) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(signal_number);
  // When the pipe is full, bytes are already waiting to wake the loop.
  [[maybe_unused]] ssize_t ignored = ::write(g_wake_fd, &byte, 1);
  errno = saved_errno;
}

void write_string(int fd, const char* text) {
  size_t length = std::strlen(text);
  while (length > 0) {
    ssize_t n = ::write(fd, text, length);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    text += n;
    length -= static_cast<size_t>(n);
  }
}

} // namespace

void set_nonblocking(const UniqueFd& fd) {
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
}

// ddprun has one thread, so no fork can come between pipe() and fcntl()
// (pipe2 would be Linux-only).
std::pair<UniqueFd, UniqueFd> make_pipe() {
  int fds[2];
  if (::pipe(fds) != 0) {
    throw std::runtime_error(std::string("cannot create a pipe: ") + std::strerror(errno));
  }
  for (int fd : fds) {
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  }
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

SignalRouter::SignalRouter() {
  auto [read_end, write_end] = make_pipe();
  read_ = std::move(read_end);
  write_ = std::move(write_end);
  set_nonblocking(read_);
  set_nonblocking(write_); // a signal handler must never block
  g_wake_fd = write_.get();

  sigemptyset(&routed_);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal_number : kStopSignals) {
    struct sigaction previous {};
    ::sigaction(signal_number, nullptr, &previous);
    if (signal_number != SIGTERM && previous.sa_handler == SIG_IGN) {
      continue;
    }
    replace(signal_number, action);
  }
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  replace(SIGCHLD, action);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  replace(SIGPIPE, ignore);
}

SignalRouter::~SignalRouter() {
  restore_dispositions();
  g_wake_fd = -1;
}

std::vector<int> SignalRouter::take() {
  std::vector<int> received;
  unsigned char bytes[64];
  ssize_t n;
  while ((n = ::read(read_.get(), bytes, sizeof(bytes))) > 0 || (n < 0 && errno == EINTR)) {
    received.insert(received.end(), bytes, bytes + std::max<ssize_t>(n, 0));
  }
  return received;
}

void SignalRouter::restore_dispositions() const {
  for (const Saved& saved : saved_) {
    ::sigaction(saved.signal_number, &saved.action, nullptr);
  }
}

void SignalRouter::replace(int signal_number, const struct sigaction& action) {
  Saved saved{signal_number, {}};
  ::sigaction(signal_number, &action, &saved.action);
  saved_.push_back(saved);
  if (action.sa_handler == on_signal) {
    sigaddset(&routed_, signal_number);
  }
}

[[noreturn]] void exec_child(const ChildSetup& setup) {
  ::setpgid(0, 0); // See Note [Process groups] in supervisor.cpp.
#ifdef __linux__
  // If ddprun itself is killed (SIGKILL, OOM killer), its ranks die too rather
  // than hold GPUs and ports. The check closes the race with a ddprun that
  // died before prctl.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != setup.parent) {
    ::_exit(127);
  }
#endif
  if (::dup2(setup.stdin_fd, STDIN_FILENO) < 0 || ::dup2(setup.stdout_fd, STDOUT_FILENO) < 0 ||
      ::dup2(setup.stderr_fd, STDERR_FILENO) < 0) {
    ::_exit(127);
  }
  setup.signals->restore_dispositions();
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  environ = setup.envp;
  ::execvp(setup.argv[0], setup.argv);
  const int error = errno;
  write_string(STDERR_FILENO, "ddprun: cannot run '");
  write_string(STDERR_FILENO, setup.argv[0]);
  write_string(STDERR_FILENO, "': ");
  write_string(STDERR_FILENO, std::strerror(error));
  write_string(STDERR_FILENO, "\n");
  ::_exit(127);
}

} // namespace ddp::launch
