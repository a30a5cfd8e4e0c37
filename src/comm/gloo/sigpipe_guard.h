#pragma once

// Keeping SIGPIPE away from the threads that write to Gloo's sockets
// (private header).
//
// Note [SIGPIPE and Gloo]
// Gloo's TCP pairs write with writev(2), which cannot take MSG_NOSIGNAL. A
// write to a connection that the peer has reset (a rank that died with data
// still unread in its socket) raises SIGPIPE in the writing thread, and the
// default action of SIGPIPE ends the whole process at once, before Gloo sees
// EPIPE and before we can raise RemoteError. A Python program never meets
// this because the interpreter ignores SIGPIPE; a C++ program does.
//
// We leave the process's disposition alone (a user's own pipes keep their
// default behaviour) and block SIGPIPE in exactly the threads that write to
// Gloo's sockets; a blocked SIGPIPE is never delivered and the write fails
// with EPIPE, which Gloo reports as a closed connection:
//   - the group's worker and monitor threads and Gloo's event-loop thread,
//     for their whole life: a thread starts with its creator's signal mask,
//     so all of them are created under a SigpipeGuard (blocking SIGPIPE
//     first thing in the new thread would leave a window in which a
//     SIGPIPE sent to it kills the process);
//   - a caller's thread while it runs a call that may write (the rendezvous,
//     posting a send or a recv): a SigpipeGuard for the call's duration,
//     which discards a SIGPIPE raised meanwhile before it unblocks it.

#include <signal.h>

namespace ddp::internal {

// Blocks SIGPIPE in the calling thread for its lifetime; at the end it
// discards a SIGPIPE that became pending meanwhile, then unblocks it (unless
// it was blocked already). Not thread-safe: it belongs to the thread that
// made it.
class SigpipeGuard {
 public:
  SigpipeGuard() noexcept;
  ~SigpipeGuard();

  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  bool was_blocked_ = false;
};

} // namespace ddp::internal
