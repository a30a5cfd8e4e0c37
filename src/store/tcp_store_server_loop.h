#pragma once

// The TCPStore server's state (private header): TCPStoreServerLoop, the
// connections it serves and the helpers they hold. Only the three files
// that define its members include it: tcp_store_server.cpp (the loop; its
// narrative is the "How it works" at the top of tcp_store.cpp),
// tcp_store_server_epoll.cpp (the loop's wait for its sockets) and
// tcp_store_budget.cpp (the buffer budget, under "Bounds").

#include <ddp/comm/error.h>

#include "store/socket.h"
#include "store/tcp_store_protocol.h"
#include "internal/logging.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unistd.h>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ddp::internal {

// Leaves new elements uninitialised, so that sizing a body buffer for a 64
// MiB message writes no page before its bytes arrive.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  // Placement new constructs in memory the vector owns; it allocates nothing.
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Body = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// Logs warnings, at most kWarningsPerWindow per kWarningWindow.
// Thread-safety: none; the server thread only.
class WarningLimiter {
 public:
  // At most this many warnings per window, then a count of those left out: a
  // flood of hostile connections must not flood the log.
  static constexpr int kWarningsPerWindow = 20;
  static constexpr std::chrono::seconds kWarningWindow{10};

  void warn(const std::string& message) {
    const auto now = SteadyClock::now();
    if (now - window_start_ >= kWarningWindow) {
      tick(now);
      window_start_ = now;
    }
    if (logged_ < kWarningsPerWindow) {
      ++logged_;
      log_warning(message);
    } else {
      ++left_out_;
    }
  }

  // Ends the window once it is over, saying how many warnings it left out.
  void tick(SteadyClock::time_point now) {
    if (now - window_start_ < kWarningWindow) {
      return;
    }
    if (left_out_ > 0) {
      log_warning(
          "TCPStore server: " + std::to_string(left_out_) + " more warnings like the above in " +
          std::to_string(kWarningWindow.count()) + " s were left out");
    }
    logged_ = 0;
    left_out_ = 0;
  }

  // When tick() has something to say.
  SteadyClock::time_point deadline() const {
    return left_out_ > 0 ? window_start_ + kWarningWindow : SteadyClock::time_point::max();
  }

 private:
  SteadyClock::time_point window_start_{};
  int logged_ = 0;
  int64_t left_out_ = 0;
};

// The state and loop of one server; runs on the server thread. Only `run`
// touches the map, the connections and the budget; the worker count is
// shared with the TCPStoreServer methods under `mutex_`, and the budget's
// figures are published in atomics. Its members are defined in
// tcp_store_server_epoll.cpp (the loop's wait), tcp_store_server.cpp (the
// rest of the loop, the requests, the parked waiters) and
// tcp_store_budget.cpp (the budget and its throttled queue: see "Bounds"
// there).
//
// Thread-safety: `run` on the server thread; `request_stop`, `wait_stopped`,
// `wait_for_workers`, `workers`, `buffered` and `peak_buffered` from any
// thread.
class TCPStoreServerLoop {
 public:
  struct Limits {
    std::string token; // empty: none
    std::chrono::milliseconds handshake_timeout;
    std::chrono::milliseconds idle_timeout;
    size_t max_buffered_bytes;
  };

  TCPStoreServerLoop(Socket listener, Socket wake_read, Socket wake_write, Limits limits)
      : listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        limits_(std::move(limits)) {
    const std::chrono::milliseconds longest(tcp_store::kMaxTimeoutMs);
    limits_.handshake_timeout = std::min(limits_.handshake_timeout, longest);
    limits_.idle_timeout = std::min(limits_.idle_timeout, longest);
  }

  // The body of the server thread. Never throws.
  void run() noexcept;

  // Asks `run` to return; does not wait.
  void request_stop() noexcept {
    stop_.store(true);
    const uint8_t byte = 1;
    // A full pipe already holds a wake-up; nothing else can go wrong here.
    [[maybe_unused]] const ssize_t n = ::write(wake_write_.fd(), &byte, 1);
  }

  // Waits up to `timeout` for `run` to return; true when it has.
  bool wait_stopped(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return stopped_; });
  }

  void wait_for_workers(int64_t count, std::chrono::milliseconds timeout, int port) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done = changed_.wait_for(
        lock, timeout, [&] { return workers_ >= count || stopped_; });
    if (workers_ >= count) {
      return;
    }
    if (done) {
      throw IoError(
          "TCPStore server on port " + std::to_string(port) +
          ": the server stopped while waiting for " + std::to_string(count) +
          " workers (" + std::to_string(workers_) + " connected)");
    }
    throw TimeoutError(
        "TCPStore server on port " + std::to_string(port) + ": timed out after " +
        std::to_string(timeout.count()) + " ms waiting for " +
        std::to_string(count) + " workers to connect (" +
        std::to_string(workers_) + " connected)");
  }

  int64_t workers() {
    std::lock_guard<std::mutex> lock(mutex_);
    return workers_;
  }

  int64_t buffered() const {
    return buffered_published_.load(std::memory_order_relaxed);
  }

  int64_t peak_buffered() const {
    return peak_buffered_.load(std::memory_order_relaxed);
  }

 private:
  // A get or wait whose keys were missing: the connection waits here, and
  // reads no further requests, until they are all set or `deadline` passes.
  struct Waiter {
    tcp_store::Command command;
    std::vector<std::string> keys;
    SteadyClock::time_point deadline;
    // How many distinct keys of `keys` were missing when it was registered
    // in watchers_ and have not been set since: at 0 it may be answered.
    size_t unseen = 0;
  };

  // A descriptor's registration in the loop's epoll set (Note [epoll] in
  // tcp_store_server_epoll.cpp): whether it is in, and for which events.
  struct EpollEntry {
    bool added = false;
    uint32_t events = 0;
  };

  // What a throttled connection waits for room for.
  enum class Throttle {
    kNone,
    // The body whose header has arrived.
    kAdmit,
    // The reply of the request whose body is buffered.
    kRequest,
    // The answer of its parked waiter.
    kAnswer,
  };

  struct Connection {
    Socket socket;
    std::string peer;
    bool greeted = false;
    SteadyClock::time_point accepted_at;
    // When a byte was last received or sent (see Note [Idle connections]).
    SteadyClock::time_point last_activity;
    // The message being received: its header, then, once admitted, its body.
    uint8_t header[tcp_store::kHeaderBytes] = {};
    size_t header_size = 0;
    bool admitted = false;
    Body body;
    size_t received = 0; // bytes of `body` received
    // Charged for the request: its body and its reply reserve, of which
    // `reply_room` bytes are still unused.
    size_t in_charge = 0;
    size_t reply_room = 0;
    // Replies not yet sent, whole messages in order; `out_pos` bytes of the
    // first have gone. A message is never copied into another.
    std::deque<std::vector<uint8_t>> out;
    size_t out_pos = 0;
    size_t out_charge = 0;
    std::optional<Waiter> waiter;
    Throttle throttle = Throttle::kNone;
    size_t throttled_bytes = 0;
    // Refused: closed once its reply has gone.
    bool close_after_output = false;
    // Set when the connection is to be dropped at the end of the iteration.
    bool closing = false;
    EpollEntry epoll;

    bool output_pending() const {
      return !out.empty();
    }
    bool reads() const {
      return !closing && !close_after_output && !waiter.has_value() && !output_pending() &&
          throttle == Throttle::kNone;
    }
  };

  void loop();
  // Puts `fd` in the epoll set for `events`, tagged `tag`, or changes its
  // events, when they differ from `entry`'s; unwatch takes it out.
  void watch(int fd, uint32_t events, uint64_t tag, EpollEntry& entry);
  void unwatch(int fd, EpollEntry& entry);
  // Handles the connections woken by the last steps, closes those marked
  // closing, and retries throttled ones once memory has been released, until
  // nothing is left to do before the next epoll wait.
  void settle();
  void accept_clients();
  // Reads and handles what `conn` sent, until it would block, parks, has a
  // reply to send, is throttled or is closing.
  void pump(uint64_t id, Connection& conn);
  // recv() into `data`; 0 when nothing came (would block, or gone: closing).
  size_t receive(Connection& conn, uint8_t* data, size_t size);
  // Parses and handles the buffered message; false when throttled or refused.
  bool process(uint64_t id, Connection& conn, bool queued);
  // Handles one parsed request; false, having changed nothing, when its
  // reply has no room (throttled) or it is refused.
  bool handle(uint64_t id, Connection& conn, tcp_store::Request& request, bool queued);
  void reply(Connection& conn, std::vector<uint8_t> message);
  void flush(Connection& conn);
  void refuse(Connection& conn, const std::string& why);
  void park(uint64_t id, Connection& conn, Waiter waiter);
  void unpark(uint64_t id, Connection& conn);
  // Registers `waiter` (conn `id`'s) in watchers_ for each of its missing
  // keys, once each, and counts them; unwatch takes it out again.
  void watch_missing(uint64_t id, Waiter& waiter);
  void unwatch(uint64_t id, const Waiter& waiter);
  // Counts `key` as set for every waiter watching it (it watches it no
  // more) and answers those whose keys have all been set.
  void notify(const std::string& key);
  // Answers conn's waiter when its keys all exist or its deadline has
  // passed; true when answered.
  bool try_answer(uint64_t id, Connection& conn, bool queued);
  // Answers waiters whose deadline has passed; closes connections past
  // their handshake or idle deadline.
  void expire(SteadyClock::time_point now);
  // The next time `expire` has something to do for `conn`.
  SteadyClock::time_point deadline_of(const Connection& conn) const;
  bool has_key(const std::string& key) const {
    return map_.count(key) > 0;
  }

  // The budget (tcp_store_budget.cpp; see "Bounds" there). `queued`: the
  // caller is a throttled connection retried in its turn, which may pass the
  // older large ones.
  bool fits(size_t bytes, bool queued) const;
  // fits(), or throttles `conn` for `kind`, keeping its place in the queue
  // when it was throttled already. Leaves the queue when it fits.
  bool make_room(uint64_t id, Connection& conn, size_t bytes, bool queued, Throttle kind);
  // Charges the request announced by conn.header; false when throttled.
  bool admit(uint64_t id, Connection& conn, bool queued);
  void charge(size_t& slot, size_t bytes);
  void release(size_t& slot, size_t bytes);
  void unthrottle(uint64_t id, Connection& conn);
  void retry_throttled();
  // When every charged byte belongs to requests waiting for room, none can
  // ever get it: refuses the oldest. True when it refused one.
  bool break_deadlock();
  // Releases everything a closing connection holds.
  void drop(uint64_t id, Connection& conn);

  Socket listener_;
  // The loop's epoll set (Note [epoll] in tcp_store_server_epoll.cpp); made by loop().
  Socket epoll_;
  Socket wake_read_;
  Socket wake_write_;
  Limits limits_;
  std::atomic<bool> stop_{false};

  // Only the server thread touches what follows, down to the atomics.
  std::unordered_map<std::string, std::vector<uint8_t>> map_;
  std::unordered_map<uint64_t, Connection> connections_;
  // key -> ids of the connections whose parked waiter waits for it: it was
  // missing when the waiter was registered, and has not been set since (a
  // set hands the list to notify and removes it). So a set touches only its
  // own waiters, and a waiter for W keys costs O(W) in all, not O(W) per set
  // (W ranks each waiting for the W arrivals of a rendezvous: W x W, not W^3).
  std::unordered_map<std::string, std::vector<uint64_t>> watchers_;
  // Connections to pump before the next epoll wait: a waiter answered, output
  // drained, or room found.
  std::vector<uint64_t> resumed_;
  // Throttled connections, oldest first; each at most once.
  std::deque<uint64_t> throttled_;
  // How many of throttled_ wait for a large charge.
  size_t large_waiting_ = 0;
  size_t buffered_ = 0;
  // Set when memory is released or the queue changes: throttled connections
  // may proceed.
  bool retry_due_ = false;
  uint64_t next_id_ = 0;
  SteadyClock::time_point accept_paused_until_{};
  WarningLimiter warnings_;

  std::atomic<int64_t> buffered_published_{0};
  std::atomic<int64_t> peak_buffered_{0};

  std::mutex mutex_;
  // Notified when workers_ or stopped_ change.
  std::condition_variable changed_;
  int64_t workers_ = 0;  // Guarded by mutex_.
  bool stopped_ = false; // Guarded by mutex_.
};

} // namespace ddp::internal
