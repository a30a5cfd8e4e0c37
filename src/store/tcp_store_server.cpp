// The TCPStore server: one thread, one poll() loop, every client. The
// protocol and the design are described at the top of tcp_store.cpp; the
// terms used here (header, body, parked waiter, refused message) are its.

#include <ddp/store/tcp_store.h>

#include <ddp/comm/error.h>

#include "store/socket.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"
#include "internal/check.h"
#include "internal/logging.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <fcntl.h>
#include <mutex>
#include <optional>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <unordered_map>

namespace ddp {
namespace internal {

namespace ts = tcp_store;

namespace {

// How much one read takes from a socket; the input buffer never holds more
// than one header plus one body plus this.
constexpr size_t kReadChunkBytes = 64 * 1024;
// How long the server stays deaf to new connections after accept() ran out
// of descriptors, rather than spinning on a listener it cannot drain.
constexpr std::chrono::milliseconds kAcceptPause{100};
// How long ~TCPStoreServer waits for its thread.
constexpr std::chrono::milliseconds kStopTimeout{5000};

} // namespace

// The state and loop of one server; runs on the server thread. Only `run`
// touches the map and the connections; the worker count is shared with the
// TCPStoreServer methods under `mutex_`.
//
// Thread-safety: `run` on the server thread; `request_stop`, `wait_stopped`,
// `wait_for_workers` and `workers` from any thread.
class TCPStoreServerLoop {
 public:
  TCPStoreServerLoop(Socket listener, Socket wake_read, Socket wake_write)
      : listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)) {}

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

 private:
  // A get or wait whose keys were missing: the connection waits here, and
  // reads no further requests, until they are all set or `deadline` passes.
  struct Waiter {
    ts::Command command;
    std::vector<std::string> keys;
    SteadyClock::time_point deadline;
  };

  struct Connection {
    Socket socket;
    std::string peer;
    // Bytes received and not yet handled, from `in_pos` on.
    std::vector<uint8_t> in;
    size_t in_pos = 0;
    // Reply bytes not yet sent, from `out_pos` on.
    std::vector<uint8_t> out;
    size_t out_pos = 0;
    bool greeted = false;
    std::optional<Waiter> waiter;
    // Set when the connection is to be dropped at the end of the iteration.
    bool closing = false;

    bool output_pending() const {
      return out_pos < out.size();
    }
  };

  void loop();
  void accept_clients();
  void read_input(uint64_t id, Connection& conn);
  // Handles every complete request in `conn.in`, until one parks or a reply
  // cannot be sent at once.
  void handle_input(uint64_t id, Connection& conn);
  void handle_request(uint64_t id, Connection& conn, ts::Command command, ts::Reader& body);
  void reply(Connection& conn, std::vector<uint8_t> message);
  void flush(Connection& conn);
  void refuse(Connection& conn, const std::string& why);
  void park(uint64_t id, Connection& conn, Waiter waiter);
  void unpark(uint64_t id, Connection& conn);
  // Answers the parked waiters watching `key` whose keys now all exist.
  void notify(const std::string& key);
  void answer_waiter(uint64_t id, Connection& conn, bool timed_out);
  void expire_waiters();
  bool has_key(const std::string& key) const {
    return map_.count(key) > 0;
  }

  Socket listener_;
  Socket wake_read_;
  Socket wake_write_;
  std::atomic<bool> stop_{false};

  // Only the server thread touches what follows, down to the mutex.
  std::unordered_map<std::string, std::vector<uint8_t>> map_;
  std::unordered_map<uint64_t, Connection> connections_;
  // key -> ids of the connections whose parked waiter includes it.
  std::unordered_map<std::string, std::vector<uint64_t>> watchers_;
  // Connections whose waiter was answered: their buffered input is handled
  // before the next poll.
  std::vector<uint64_t> resumed_;
  uint64_t next_id_ = 0;
  SteadyClock::time_point accept_paused_until_{};

  std::mutex mutex_;
  // Notified when workers_ or stopped_ change.
  std::condition_variable changed_;
  int64_t workers_ = 0;  // Guarded by mutex_.
  bool stopped_ = false; // Guarded by mutex_.
};

void TCPStoreServerLoop::run() noexcept {
  try {
    loop();
  } catch (const std::exception& e) {
    log_warning(std::string("TCPStore server: stopped by an error: ") + e.what());
  } catch (...) {
    log_warning("TCPStore server: stopped by an unknown error");
  }
  // Closing every connection is what tells blocked clients that we are gone.
  connections_.clear();
  watchers_.clear();
  listener_.reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  changed_.notify_all();
}

void TCPStoreServerLoop::loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids; // ids[i] belongs to fds[i + 2]
  while (!stop_.load()) {
    fds.clear();
    ids.clear();
    fds.push_back(pollfd{wake_read_.fd(), POLLIN, 0});
    const bool accepting = SteadyClock::now() >= accept_paused_until_;
    fds.push_back(pollfd{accepting ? listener_.fd() : -1, POLLIN, 0});

    auto next_deadline = SteadyClock::time_point::max();
    for (auto& [id, conn] : connections_) {
      short events = 0;
      if (conn.output_pending()) {
        events = POLLOUT;
      } else if (conn.waiter.has_value()) {
        // Read nothing more while parked, but see the client hang up.
        events = POLLRDHUP;
        next_deadline = std::min(next_deadline, conn.waiter->deadline);
      } else {
        events = POLLIN;
      }
      fds.push_back(pollfd{conn.socket.fd(), events, 0});
      ids.push_back(id);
    }
    if (!accepting) {
      next_deadline = std::min(next_deadline, accept_paused_until_);
    }
    int timeout_ms = -1;
    if (next_deadline != SteadyClock::time_point::max()) {
      const auto left = next_deadline - SteadyClock::now();
      timeout_ms = left <= SteadyClock::duration::zero()
          ? 0
          : static_cast<int>(std::min<int64_t>(
                std::chrono::ceil<std::chrono::milliseconds>(left).count(), 60000));
    }

    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw IoError("poll(): " + errno_string(errno));
    }
    if (fds[0].revents != 0) {
      uint8_t drain[64];
      while (::read(wake_read_.fd(), drain, sizeof(drain)) > 0) {
      }
      if (stop_.load()) {
        break;
      }
    }
    if (fds[1].revents != 0) {
      accept_clients();
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const short revents = fds[i + 2].revents;
      if (revents == 0) {
        continue;
      }
      auto it = connections_.find(ids[i]);
      if (it == connections_.end()) {
        continue;
      }
      Connection& conn = it->second;
      if (conn.closing) {
        continue;
      }
      if ((revents & (POLLERR | POLLHUP | POLLNVAL)) != 0 ||
          ((revents & POLLRDHUP) != 0 && conn.waiter.has_value())) {
        conn.closing = true; // The client went away.
        continue;
      }
      if ((revents & POLLOUT) != 0) {
        flush(conn);
        if (!conn.output_pending()) {
          resumed_.push_back(ids[i]);
        }
      }
      if ((revents & POLLIN) != 0) {
        read_input(ids[i], conn);
      }
    }
    expire_waiters();
    // Handling a resumed connection's input may set keys and resume others.
    while (!resumed_.empty()) {
      const uint64_t id = resumed_.back();
      resumed_.pop_back();
      auto it = connections_.find(id);
      if (it != connections_.end() && !it->second.closing) {
        handle_input(id, it->second);
      }
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->second.closing) {
        unpark(it->first, it->second);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void TCPStoreServerLoop::accept_clients() {
  for (int i = 0; i < 256; ++i) {
    Socket socket(::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!socket.valid()) {
      const int error = errno;
      if (error == EAGAIN || error == EWOULDBLOCK) {
        return;
      }
      if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
        log_warning(
            "TCPStore server: cannot accept a connection (" + errno_string(error) +
            "); pausing accepts for " + std::to_string(kAcceptPause.count()) + " ms");
        accept_paused_until_ = SteadyClock::now() + kAcceptPause;
        return;
      }
      continue; // ECONNABORTED, EINTR, a network error of that one client.
    }
    configure_accepted(socket.fd());
    Connection conn;
    conn.peer = peer_address(socket.fd());
    conn.socket = std::move(socket);
    connections_.emplace(next_id_++, std::move(conn));
  }
}

void TCPStoreServerLoop::read_input(uint64_t id, Connection& conn) {
  if (conn.in_pos == conn.in.size()) {
    conn.in.clear();
    conn.in_pos = 0;
    if (conn.in.capacity() > 4 * kReadChunkBytes) {
      std::vector<uint8_t>().swap(conn.in); // Give back a large value's buffer.
    }
  }
  const size_t old_size = conn.in.size();
  conn.in.resize(old_size + kReadChunkBytes);
  const ssize_t n = ::recv(conn.socket.fd(), conn.in.data() + old_size, kReadChunkBytes, 0);
  if (n <= 0) {
    conn.in.resize(old_size);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return;
    }
    conn.closing = true; // End of file or a reset: the client is gone.
    return;
  }
  conn.in.resize(old_size + static_cast<size_t>(n));
  handle_input(id, conn);
}

void TCPStoreServerLoop::handle_input(uint64_t id, Connection& conn) {
  while (!conn.closing && !conn.waiter.has_value() && !conn.output_pending()) {
    const size_t available = conn.in.size() - conn.in_pos;
    if (available < ts::kHeaderBytes) {
      break;
    }
    const uint8_t* header = conn.in.data() + conn.in_pos;
    // Check the header before waiting for the body: an absurd length is
    // refused here, never allocated.
    if (!ts::is_command(header[0])) {
      refuse(conn, "unknown command byte " + std::to_string(header[0]));
      return;
    }
    const auto command = static_cast<ts::Command>(header[0]);
    const uint32_t length = ts::body_length(header);
    const uint32_t limit = ts::max_request_body(header[0]);
    if (length > limit) {
      refuse(
          conn,
          std::string("the length prefix of a ") + ts::command_name(command) +
              " request is " + std::to_string(length) +
              " bytes, over the limit of " + std::to_string(limit));
      return;
    }
    if (available - ts::kHeaderBytes < length) {
      break; // The body has not all arrived yet.
    }
    ts::Reader body(header + ts::kHeaderBytes, length);
    conn.in_pos += ts::kHeaderBytes + length;
    try {
      handle_request(id, conn, command, body);
    } catch (const ts::ProtocolError& e) {
      refuse(conn, std::string("malformed ") + ts::command_name(command) + " request: " + e.what());
      return;
    }
  }
  if (conn.in_pos == conn.in.size()) {
    conn.in.clear();
    conn.in_pos = 0;
  } else if (conn.in_pos > 0 && !conn.waiter.has_value()) {
    conn.in.erase(conn.in.begin(), conn.in.begin() + static_cast<std::ptrdiff_t>(conn.in_pos));
    conn.in_pos = 0;
  }
}

void TCPStoreServerLoop::handle_request(
    uint64_t id,
    Connection& conn,
    ts::Command command,
    ts::Reader& body) {
  using ts::Command;
  using ts::Status;
  if (!conn.greeted && command != Command::kHello) {
    throw ts::ProtocolError("the first request of a connection must be a hello");
  }
  switch (command) {
    case Command::kHello: {
      const uint32_t magic = body.u32();
      const uint32_t version = body.u32();
      const uint8_t flags = body.u8();
      body.finish();
      if (magic != ts::kMagic) {
        throw ts::ProtocolError("not a ddp TCPStore client (bad magic)");
      }
      if (version != ts::kProtocolVersion) {
        throw ts::ProtocolError(
            "protocol version " + std::to_string(version) + ", this server speaks " +
            std::to_string(ts::kProtocolVersion));
      }
      conn.greeted = true;
      if ((flags & ts::kHelloWorkerFlag) != 0) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          ++workers_;
        }
        changed_.notify_all();
      }
      reply(conn, ts::Writer(static_cast<uint8_t>(Status::kOk)).finish());
      return;
    }
    case Command::kSet: {
      std::string key = body.string(ts::kMaxKeyBytes, "key");
      std::vector<uint8_t> value = body.bytes(ts::kMaxValueBytes, "value");
      body.finish();
      map_[key] = std::move(value);
      reply(conn, ts::Writer(static_cast<uint8_t>(Status::kOk)).finish());
      notify(key);
      return;
    }
    case Command::kGet:
    case Command::kWait: {
      std::vector<std::string> keys;
      int64_t timeout_ms = 0;
      if (command == Command::kGet) {
        keys.push_back(body.string(ts::kMaxKeyBytes, "key"));
        timeout_ms = body.i64();
      } else {
        timeout_ms = body.i64();
        keys = body.keys();
      }
      body.finish();
      if (timeout_ms < 0) {
        throw ts::ProtocolError("negative timeout " + std::to_string(timeout_ms));
      }
      timeout_ms = std::min(timeout_ms, ts::kMaxTimeoutMs);
      Waiter waiter{
          command, std::move(keys), SteadyClock::now() + std::chrono::milliseconds(timeout_ms)};
      const bool ready = std::all_of(
          waiter.keys.begin(), waiter.keys.end(), [&](const std::string& k) { return has_key(k); });
      park(id, conn, std::move(waiter));
      if (ready) {
        answer_waiter(id, conn, /*timed_out=*/false);
      }
      return;
    }
    case Command::kAdd: {
      std::string key = body.string(ts::kMaxKeyBytes, "key");
      const int64_t delta = body.i64();
      body.finish();
      std::optional<std::vector<uint8_t>> current;
      auto it = map_.find(key);
      if (it != map_.end()) {
        current = it->second;
      }
      int64_t result = 0;
      try {
        result = add_to_counter("TCPStore add", key, current, delta);
      } catch (const c10::Error& e) {
        ts::Writer w(static_cast<uint8_t>(Status::kBadRequest));
        w.bytes(std::string(e.what_without_backtrace()));
        reply(conn, std::move(w).finish());
        return;
      }
      map_[key] = counter_bytes(result);
      ts::Writer w(static_cast<uint8_t>(Status::kOk));
      w.i64(result);
      reply(conn, std::move(w).finish());
      notify(key);
      return;
    }
    case Command::kCompareSet: {
      std::string key = body.string(ts::kMaxKeyBytes, "key");
      std::vector<uint8_t> expected = body.bytes(ts::kMaxValueBytes, "expected value");
      std::vector<uint8_t> desired = body.bytes(ts::kMaxValueBytes, "desired value");
      body.finish();
      std::optional<std::vector<uint8_t>> current;
      auto it = map_.find(key);
      if (it != map_.end()) {
        current = it->second;
      }
      std::vector<uint8_t> result;
      auto next = compare_set_outcome(current, expected, desired, result);
      ts::Writer w(static_cast<uint8_t>(Status::kOk));
      w.bytes(result);
      reply(conn, std::move(w).finish());
      if (next.has_value()) {
        map_[key] = std::move(*next);
        notify(key);
      }
      return;
    }
    case Command::kCheck: {
      const std::vector<std::string> keys = body.keys();
      body.finish();
      const bool all = std::all_of(
          keys.begin(), keys.end(), [&](const std::string& k) { return has_key(k); });
      ts::Writer w(static_cast<uint8_t>(Status::kOk));
      w.u8(all ? 1 : 0);
      reply(conn, std::move(w).finish());
      return;
    }
    case Command::kDeleteKey: {
      const std::string key = body.string(ts::kMaxKeyBytes, "key");
      body.finish();
      ts::Writer w(static_cast<uint8_t>(Status::kOk));
      w.u8(map_.erase(key) > 0 ? 1 : 0);
      reply(conn, std::move(w).finish());
      return;
    }
    case Command::kNumKeys: {
      body.finish();
      ts::Writer w(static_cast<uint8_t>(Status::kOk));
      w.i64(static_cast<int64_t>(map_.size()));
      reply(conn, std::move(w).finish());
      return;
    }
  }
  throw ts::ProtocolError("unhandled command"); // is_command() let it through
}

void TCPStoreServerLoop::reply(Connection& conn, std::vector<uint8_t> message) {
  if (conn.output_pending()) {
    conn.out.insert(conn.out.end(), message.begin(), message.end());
  } else {
    conn.out = std::move(message);
    conn.out_pos = 0;
  }
  flush(conn);
}

void TCPStoreServerLoop::flush(Connection& conn) {
  while (conn.output_pending()) {
    const ssize_t n = ::send(
        conn.socket.fd(), conn.out.data() + conn.out_pos, conn.out.size() - conn.out_pos,
        MSG_NOSIGNAL);
    if (n > 0) {
      conn.out_pos += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return; // poll() tells us when there is room.
    }
    conn.closing = true; // The client is gone.
    return;
  }
  conn.out.clear();
  conn.out_pos = 0;
  if (conn.out.capacity() > 4 * kReadChunkBytes) {
    std::vector<uint8_t>().swap(conn.out);
  }
}

void TCPStoreServerLoop::refuse(Connection& conn, const std::string& why) {
  log_warning(
      "TCPStore server: refused a message from " + conn.peer +
      " and dropped its connection: " + why);
  conn.closing = true;
  conn.in.clear();
  conn.in_pos = 0;
}

void TCPStoreServerLoop::park(uint64_t id, Connection& conn, Waiter waiter) {
  for (const auto& key : waiter.keys) {
    auto& ids = watchers_[key];
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
      ids.push_back(id);
    }
  }
  conn.waiter = std::move(waiter);
}

void TCPStoreServerLoop::unpark(uint64_t id, Connection& conn) {
  if (!conn.waiter.has_value()) {
    return;
  }
  for (const auto& key : conn.waiter->keys) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) {
      continue;
    }
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) {
      watchers_.erase(it);
    }
  }
  conn.waiter.reset();
}

void TCPStoreServerLoop::notify(const std::string& key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) {
    return;
  }
  const std::vector<uint64_t> ids = it->second; // answer_waiter edits the list
  for (const uint64_t id : ids) {
    auto conn_it = connections_.find(id);
    if (conn_it == connections_.end() || !conn_it->second.waiter.has_value()) {
      continue;
    }
    Connection& conn = conn_it->second;
    const auto& keys = conn.waiter->keys;
    if (std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return has_key(k); })) {
      answer_waiter(id, conn, /*timed_out=*/false);
      resumed_.push_back(id);
    }
  }
}

void TCPStoreServerLoop::answer_waiter(uint64_t id, Connection& conn, bool timed_out) {
  const Waiter& waiter = *conn.waiter;
  std::vector<uint8_t> message;
  if (timed_out) {
    std::vector<std::string> missing;
    for (const auto& key : waiter.keys) {
      if (!has_key(key)) {
        missing.push_back(key);
      }
    }
    ts::Writer w(static_cast<uint8_t>(ts::Status::kTimedOut));
    w.keys(missing);
    message = std::move(w).finish();
  } else {
    ts::Writer w(static_cast<uint8_t>(ts::Status::kOk));
    if (waiter.command == ts::Command::kGet) {
      w.bytes(map_.at(waiter.keys.front()));
    }
    message = std::move(w).finish();
  }
  unpark(id, conn);
  reply(conn, std::move(message));
}

void TCPStoreServerLoop::expire_waiters() {
  const auto now = SteadyClock::now();
  for (auto& [id, conn] : connections_) {
    if (!conn.closing && conn.waiter.has_value() && conn.waiter->deadline <= now) {
      answer_waiter(id, conn, /*timed_out=*/true);
      resumed_.push_back(id);
    }
  }
}

} // namespace internal

TCPStoreServer::TCPStoreServer(int port) {
  DDP_CHECK(
      port >= 0 && port <= 65535,
      "TCPStoreServer: port must be in [0, 65535] (got ", port, ")");
  internal::Socket listener = internal::listen_on(port, &port_);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    throw IoError("TCPStore server: pipe2(): " + internal::errno_string(errno));
  }
  loop_ = std::make_shared<internal::TCPStoreServerLoop>(
      std::move(listener), internal::Socket(pipe_fds[0]), internal::Socket(pipe_fds[1]));
  // The thread holds its own reference: see ~TCPStoreServer.
  thread_ = std::thread([loop = loop_] { loop->run(); });
}

TCPStoreServer::~TCPStoreServer() noexcept {
  try {
    loop_->request_stop();
    if (loop_->wait_stopped(internal::kStopTimeout)) {
      thread_.join();
    } else {
      internal::log_warning(
          "TCPStore server on port " + std::to_string(port_) + ": its thread did not stop within " +
          std::to_string(internal::kStopTimeout.count()) + " ms; leaving it behind");
      thread_.detach();
    }
  } catch (...) {
    // join() or logging failed; nothing more can be done in a destructor.
    if (thread_.joinable()) {
      thread_.detach();
    }
  }
}

int TCPStoreServer::port() const {
  return port_;
}

void TCPStoreServer::wait_for_workers(int64_t count, std::chrono::milliseconds timeout) {
  loop_->wait_for_workers(count, timeout, port_);
}

int64_t TCPStoreServer::num_workers_connected() const {
  return loop_->workers();
}

} // namespace ddp
