#pragma once

// What this rank's own sockets say of a peer that has stopped answering
// (private header; Note [Silent peers]).
//
// Note [Silent peers]. When the link to another host goes down in the
// middle of a collective, the ranks on the far side of it time out waiting,
// and the store, whose server is on rank 0's host, is out of reach too: it
// cannot tell them whom they waited for. Their TCP connections can. While a
// collective stalls (the group's monitor sees it after kStallDelay), a
// thread of this class turns on TCP keepalive on the group's connections
// (a probe after 1 s of quiet, then one a second) and reads each
// connection's TCP state (TCP_INFO) every kInterval; the thread is its own
// because the monitor's store calls block when the store is out of reach.
// A connection is silent when something it sent, a keepalive probe or
// data, is unacknowledged and nothing has been acknowledged on it for
// kSilence: the peer's host is not answering at the TCP level, which a
// stuck or stopped process on a reachable host still does (its kernel
// acknowledges). The last reading is kept, because Gloo closes every
// connection of a rank the moment an operation of it times out, before the
// error is built; the error then names the silent ranks. Keepalive goes off
// again when no collective stalls: with a full mesh of connections, a probe
// a second on every idle pair of a large job would be a flood. The kernel
// gives up on a connection after 1000 unanswered probes (about 17 minutes,
// close to what TCP's retransmissions allow a connection with data in
// flight): a link down that long ends a collective waiting under the
// default 30-minute timeout as a lost connection rather than a timeout.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ddp::internal {

// Thread-safety: every method may be called from any thread.
class SilentPeers {
 public:
  // `peer_addresses`: exchange_peer_addresses' (address, rank) pairs.
  // Starts the sampling thread, idle until a collective stalls.
  explicit SilentPeers(std::vector<std::pair<std::string, int>> peer_addresses);
  ~SilentPeers();
  SilentPeers(const SilentPeers&) = delete;
  SilentPeers& operator=(const SilentPeers&) = delete;

  // Whether a collective stalls now (the monitor, on each of its ticks):
  // while one does, keepalive is on and the connections are read every
  // kInterval; once none does, keepalive goes off again.
  void set_stalled(bool stalled);
  // "; this rank's connections to rank(s) [0, 1] had gone unanswered for
  // up to 3.2 s (...)", from the last reading if it is fresh (kFresh), or
  // "" when none was silent.
  std::string clause() const;

  // How long nothing is acknowledged, with something outstanding, before a
  // connection counts as silent.
  static constexpr std::chrono::milliseconds kSilence{2000};
  static constexpr std::chrono::milliseconds kInterval{250};
  // How long a reading is told after it was taken: an error is built
  // within the store's diagnosis budget (1 s) of the connections closing;
  // an older reading is of an earlier stall.
  static constexpr std::chrono::milliseconds kFresh{3000};

 private:
  void run();
  // Keepalive on, and a new reading of every connection.
  void sample();
  // Keepalive off again, where sample turned it on.
  void relax();

  const std::vector<std::pair<std::string, int>> peer_addresses_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;                    // guarded by mutex_
  bool stalled_ = false;                 // guarded by mutex_
  bool keepalive_on_ = false;            // touched by the thread only
  std::vector<int> silent_;              // guarded by mutex_; ranks, ascending
  std::chrono::milliseconds longest_{0}; // guarded by mutex_
  std::chrono::steady_clock::time_point read_at_{}; // guarded by mutex_; of silent_
  std::thread thread_;
};

} // namespace ddp::internal
