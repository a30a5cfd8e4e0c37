// The TCPStore server's wait for its sockets (Note [epoll]): the loop of
// TCPStoreServerLoop (tcp_store_server_loop.h), which hands what is ready to
// the request handling of tcp_store_server.cpp.

#include <ddp/comm/error.h>

#include "store/socket.h"
#include "store/store_util.h"
#include "store/tcp_store_server_loop.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <sys/epoll.h>
#include <unistd.h>
#include <vector>

namespace ddp::internal {

using std::chrono::milliseconds;

// Note [epoll]. The loop waits with epoll, level-triggered, rather than
// poll(): poll() hands the kernel every connection's descriptor on every
// wake-up, and with a thousand ranks parked in a rendezvous that scan was
// about a sixth of the server's CPU (perf). Each iteration still works out,
// in user space, which events each connection wants (output to send: out;
// parked, throttled or refused: only the hang-up; otherwise: in), and tells
// epoll only when that changed. A closed descriptor leaves the epoll set by
// itself only when no other process holds a copy of it (a child forked
// without exec does), so a dropped connection is taken out explicitly.
// Events are tagged with the connection's id, which is never reused, so an
// event of a connection dropped earlier in the same batch finds nothing.
void TCPStoreServerLoop::loop() {
  epoll_ = Socket(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) {
    throw IoError("epoll_create1(): " + errno_string(errno));
  }
  constexpr uint64_t kWakeTag = ~uint64_t{0};
  constexpr uint64_t kListenerTag = kWakeTag - 1;
  EpollEntry wake;
  watch(wake_read_.fd(), EPOLLIN, kWakeTag, wake);
  EpollEntry listener;
  std::vector<epoll_event> ready(512);

  while (!stop_.load()) {
    const bool accepting = SteadyClock::now() >= accept_paused_until_;
    watch(listener_.fd(), accepting ? uint32_t{EPOLLIN} : uint32_t{0}, kListenerTag, listener);

    auto next_deadline = SteadyClock::time_point::max();
    for (auto& [id, conn] : connections_) {
      uint32_t events = 0;
      if (conn.output_pending()) {
        events = EPOLLOUT;
      } else if (!conn.reads()) {
        // Parked, throttled or refused: read nothing more, but see the
        // client hang up.
        events = EPOLLRDHUP;
      } else {
        events = EPOLLIN;
      }
      next_deadline = std::min(next_deadline, deadline_of(conn));
      watch(conn.socket.fd(), events, id, conn.epoll);
    }
    if (!accepting) {
      next_deadline = std::min(next_deadline, accept_paused_until_);
    }
    next_deadline = std::min(next_deadline, warnings_.deadline());
    int timeout_ms = -1;
    if (next_deadline != SteadyClock::time_point::max()) {
      const auto left = next_deadline - SteadyClock::now();
      timeout_ms = left <= SteadyClock::duration::zero()
          ? 0
          : static_cast<int>(std::min<int64_t>(
                std::chrono::ceil<milliseconds>(left).count(), 60000));
    }

    const int n = ::epoll_wait(epoll_.fd(), ready.data(), static_cast<int>(ready.size()), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw IoError("epoll_wait(): " + errno_string(errno));
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = ready[i].data.u64;
      const uint32_t revents = ready[i].events;
      if (tag == kWakeTag) {
        uint8_t drain[64];
        while (::read(wake_read_.fd(), drain, sizeof(drain)) > 0) {
        }
        if (stop_.load()) {
          return;
        }
        continue;
      }
      if (tag == kListenerTag) {
        accept_clients();
        continue;
      }
      auto it = connections_.find(tag);
      if (it == connections_.end()) {
        continue;
      }
      Connection& conn = it->second;
      if (conn.closing) {
        continue;
      }
      if ((revents & (EPOLLERR | EPOLLHUP)) != 0 ||
          ((revents & EPOLLRDHUP) != 0 && !conn.reads())) {
        conn.closing = true; // The client went away.
        continue;
      }
      if ((revents & EPOLLOUT) != 0) {
        flush(conn);
        if (!conn.output_pending()) {
          resumed_.push_back(tag);
        }
      }
      if ((revents & EPOLLIN) != 0) {
        pump(tag, conn);
      }
    }
    expire(SteadyClock::now());
    settle();
    warnings_.tick(SteadyClock::now());
  }
}

void TCPStoreServerLoop::watch(int fd, uint32_t events, uint64_t tag, EpollEntry& entry) {
  if (entry.added && events == entry.events) {
    return;
  }
  epoll_event event{};
  event.events = events;
  event.data.u64 = tag;
  if (::epoll_ctl(epoll_.fd(), entry.added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &event) != 0) {
    throw IoError("epoll_ctl(): " + errno_string(errno));
  }
  entry.added = true;
  entry.events = events;
}

void TCPStoreServerLoop::unwatch(int fd, EpollEntry& entry) {
  // Closing the descriptor would not take it out of the set while a forked
  // child holds a copy of it (Note [epoll]).
  if (entry.added) {
    ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, fd, nullptr);
    entry.added = false;
  }
}

} // namespace ddp::internal
