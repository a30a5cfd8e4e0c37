#include "comm/gloo/silent_peers.h"

#include <algorithm>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <c10/util/StringUtil.h>

#include "comm/gloo/gloo_rendezvous.h"

namespace ddp::internal {

namespace {

// Keepalive: first probe after this many seconds of quiet, then one every
// this many seconds; the kernel gives up on the connection only after
// kKeepaliveProbes unanswered ones (about 17 minutes; Note [Silent peers]).
constexpr int kKeepaliveIdleS = 1;
constexpr int kKeepaliveIntervalS = 1;
constexpr int kKeepaliveProbes = 1000;

void set_keepalive(int fd, bool on) {
  const int enable = on ? 1 : 0;
  if (on) {
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepaliveIdleS, sizeof(kKeepaliveIdleS));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepaliveIntervalS, sizeof(kKeepaliveIntervalS));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepaliveProbes, sizeof(kKeepaliveProbes));
  }
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &enable, sizeof(enable));
}

} // namespace

SilentPeers::SilentPeers(std::vector<std::pair<std::string, int>> peer_addresses)
    : peer_addresses_(std::move(peer_addresses)) {
  if (!peer_addresses_.empty()) {
    thread_ = std::thread([this] { run(); });
  }
}

SilentPeers::~SilentPeers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void SilentPeers::set_stalled(bool stalled) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stalled_ == stalled) {
      return;
    }
    stalled_ = stalled;
  }
  wake_.notify_all();
}

void SilentPeers::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (stalled_) {
      wake_.wait_for(lock, kInterval);
    } else if (!keepalive_on_) {
      // Idle until a collective stalls: no wake-ups on a healthy group.
      wake_.wait(lock, [&] { return stop_ || stalled_; });
    } // else: the stall ended while sampling; keepalive goes off now

    if (stop_) {
      break;
    }
    const bool stalled = stalled_;
    lock.unlock();
    if (stalled) {
      sample();
    } else if (keepalive_on_) {
      relax();
    }
    lock.lock();
  }
}

void SilentPeers::sample() {
  std::vector<int> silent;
  std::chrono::milliseconds longest{0};
  const auto sockets = peer_sockets(peer_addresses_);
  if (sockets.empty()) {
    // Gloo closed them (an operation timed out): the last reading is what
    // the error will tell.
    return;
  }
  for (const auto& [fd, rank] : sockets) {
    if (!keepalive_on_) {
      set_keepalive(fd, true);
    }
    tcp_info info{};
    socklen_t size = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0) {
      continue;
    }
    // Outstanding: a keepalive probe or data not yet acknowledged.
    const bool outstanding = info.tcpi_probes > 0 || info.tcpi_unacked > 0;
    const std::chrono::milliseconds quiet(info.tcpi_last_ack_recv);
    if (outstanding && quiet >= kSilence) {
      silent.push_back(rank);
      longest = std::max(longest, quiet);
    }
  }
  keepalive_on_ = true;
  std::sort(silent.begin(), silent.end());
  silent.erase(std::unique(silent.begin(), silent.end()), silent.end());
  std::lock_guard<std::mutex> lock(mutex_);
  silent_ = std::move(silent);
  longest_ = longest;
  read_at_ = std::chrono::steady_clock::now();
}

void SilentPeers::relax() {
  for (const auto& [fd, rank] : peer_sockets(peer_addresses_)) {
    set_keepalive(fd, false);
  }
  // The last reading stays for an error built just after the collective
  // ended (clause() tells it while it is fresh).
  keepalive_on_ = false;
}

std::string SilentPeers::clause() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (silent_.empty() || std::chrono::steady_clock::now() - read_at_ > kFresh) {
    return "";
  }
  return c10::str("; this rank's connections to rank(s) [", c10::Join(", ", silent_),
                  "] had gone unanswered for up to ",
                  (longest_.count() + 50) / 100 / 10.0,
                  " s (keepalive probes or data not acknowledged by their host: the network to them may be "
                  "down)");
}

} // namespace ddp::internal
