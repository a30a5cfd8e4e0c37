#include "comm/gloo/sigpipe_guard.h"

#include <pthread.h>

#include <ctime>

namespace ddp::internal {

namespace {

sigset_t sigpipe_only() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  return set;
}

} // namespace

SigpipeGuard::SigpipeGuard() noexcept {
  const sigset_t set = sigpipe_only();
  sigset_t previous;
  sigemptyset(&previous);
  pthread_sigmask(SIG_BLOCK, &set, &previous);
  was_blocked_ = sigismember(&previous, SIGPIPE) == 1;
}

SigpipeGuard::~SigpipeGuard() {
  if (was_blocked_) {
    return;
  }
  const sigset_t set = sigpipe_only();
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
    // Raised by a write of ours while it was blocked: take it, so that
    // unblocking does not deliver it. A zero timeout never waits.
    const timespec zero{0, 0};
    while (sigtimedwait(&set, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

} // namespace ddp::internal
