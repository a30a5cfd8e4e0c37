// The TCPStore server: one thread, one epoll loop (its wait in
// tcp_store_server_epoll.cpp), every client. The protocol and the design
// are described at the top of tcp_store.cpp; the terms used here (header,
// body, parked waiter, refused message) are its.
// The budget that bounds what the server buffers is in tcp_store_budget.cpp,
// under "Bounds"; the class both files define, TCPStoreServerLoop, is in
// tcp_store_server_loop.h.
//
// Note [Idle connections]. A greeted connection that neither sends nor
// receives a byte for the idle timeout is closed, except while it is parked
// (a get or wait may rightly last days) or throttled (then the wait is the
// server's). The hello reply tells the client the idle timeout, and the
// client reuses a pooled connection only within half of it (TCPStoreClient::
// acquire in tcp_store.cpp), so that a live client never sends a request on a
// connection the server is closing for idleness.

#include <ddp/store/tcp_store.h>

#include <ddp/comm/error.h>

#include "store/socket.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_server_loop.h"
#include "internal/check.h"
#include "internal/logging.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <optional>
#include <sys/socket.h>
#include <unistd.h>

namespace ddp {
namespace internal {

namespace ts = tcp_store;

namespace {

using std::chrono::milliseconds;

// The most one connection's read takes per wake-up, so that one fast client
// sending 64 MiB does not keep the loop from the others.
constexpr size_t kMaxReadPerWakeup = 1 << 20;
// How long the server stays deaf to new connections after accept() ran out
// of descriptors, rather than spinning on a listener it cannot drain.
constexpr milliseconds kAcceptPause{100};
// How long ~TCPStoreServer waits for its thread.
constexpr milliseconds kStopTimeout{5000};

// `start` plus `duration`, which counts as 30 days at most: no overflow.
SteadyClock::time_point after(SteadyClock::time_point start, milliseconds duration) {
  return start + std::min(duration, milliseconds(ts::kMaxTimeoutMs));
}

} // namespace

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
  epoll_.reset();
  listener_.reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  changed_.notify_all();
}

void TCPStoreServerLoop::settle() {
  while (true) {
    // Handling a resumed connection's input may set keys and resume others.
    while (!resumed_.empty()) {
      const uint64_t id = resumed_.back();
      resumed_.pop_back();
      auto it = connections_.find(id);
      if (it != connections_.end() && !it->second.closing) {
        pump(id, it->second);
      }
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->second.closing) {
        drop(it->first, it->second);
        unwatch(it->second.socket.fd(), it->second.epoll);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (retry_due_ && !throttled_.empty()) {
      retry_throttled();
    }
    // A connection refused by a retry must be closed now, not at the next
    // wake-up, which may be far.
    const bool closing = std::any_of(
        connections_.begin(), connections_.end(), [](const auto& c) { return c.second.closing; });
    if (resumed_.empty() && !closing && !break_deadlock()) {
      break;
    }
  }
  retry_due_ = false;
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
        warnings_.warn(
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
    conn.accepted_at = conn.last_activity = SteadyClock::now();
    connections_.emplace(next_id_++, std::move(conn));
  }
}

size_t TCPStoreServerLoop::receive(Connection& conn, uint8_t* data, size_t size) {
  while (true) {
    const ssize_t n = ::recv(conn.socket.fd(), data, size, 0);
    if (n > 0) {
      conn.last_activity = SteadyClock::now();
      return static_cast<size_t>(n);
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    }
    conn.closing = true; // End of file or a reset: the client is gone.
    return 0;
  }
}

void TCPStoreServerLoop::pump(uint64_t id, Connection& conn) {
  size_t allowance = kMaxReadPerWakeup;
  while (conn.reads()) {
    if (!conn.admitted) {
      // The header a few bytes at a time at most, each checked as it comes:
      // nothing is buffered beyond it until it is accepted and admitted.
      const size_t n = receive(conn, conn.header + conn.header_size, ts::kHeaderBytes - conn.header_size);
      if (n == 0) {
        return;
      }
      conn.header_size += n;
      if (auto why = ts::check_header(conn.header, conn.header_size, conn.greeted)) {
        refuse(conn, *why);
        return;
      }
      if (conn.header_size < ts::kHeaderBytes || !admit(id, conn, /*queued=*/false)) {
        continue; // reads() is false when throttled
      }
    }
    if (conn.received < conn.body.size()) {
      if (allowance == 0) {
        return; // epoll brings us back; the other clients go first.
      }
      const size_t want = std::min(conn.body.size() - conn.received, allowance);
      const size_t n = receive(conn, conn.body.data() + conn.received, want);
      if (n == 0) {
        return;
      }
      conn.received += n;
      allowance -= n;
      continue;
    }
    process(id, conn, /*queued=*/false);
  }
}

bool TCPStoreServerLoop::process(uint64_t id, Connection& conn, bool queued) {
  const auto command = static_cast<ts::Command>(conn.header[0]);
  ts::Request request;
  try {
    request = ts::parse_request(command, conn.body.data(), conn.body.size());
  } catch (const ts::ProtocolError& e) {
    refuse(conn, std::string("malformed ") + ts::command_name(command) + " request: " + e.what());
    return false;
  }
  if (!handle(id, conn, request, queued)) {
    return false;
  }
  // The request is done with: give its body and what is left of its reply
  // reserve back.
  release(conn.in_charge, conn.in_charge);
  conn.reply_room = 0;
  Body().swap(conn.body);
  conn.header_size = 0;
  conn.admitted = false;
  conn.received = 0;
  return true;
}

bool TCPStoreServerLoop::handle(
    uint64_t id,
    Connection& conn,
    ts::Request& request,
    bool queued) {
  using ts::Command;
  using ts::Status;
  // Each case works out its reply's size first, and changes nothing until
  // that reply has room. The reply reserve always has it, but for a
  // compare_set returning a large current value, which may have to wait
  // (and is then handled again from the start).
  const auto room = [&](size_t body_bytes) {
    const size_t bytes = ts::kHeaderBytes + body_bytes;
    return bytes <= conn.reply_room ||
        make_room(id, conn, bytes - conn.reply_room, queued, Throttle::kRequest);
  };
  const auto status = [](Status s) { return static_cast<uint8_t>(s); };
  switch (request.command) {
    case Command::kHello: {
      if (!limits_.token.empty() && !ts::token_matches(limits_.token, request.token)) {
        const std::string why = "wrong or missing DDP_STORE_TOKEN";
        if (!room(4 + why.size())) {
          return false;
        }
        warnings_.warn(
            "TCPStore server: refused the handshake of " + conn.peer +
            ": wrong or missing DDP_STORE_TOKEN");
        ts::Writer w(status(Status::kRefused), 4 + why.size());
        w.bytes(why);
        conn.close_after_output = true;
        reply(conn, std::move(w).finish());
        return true;
      }
      if (!room(8)) {
        return false;
      }
      conn.greeted = true;
      if ((request.flags & ts::kHelloWorkerFlag) != 0) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          ++workers_;
        }
        changed_.notify_all();
      }
      // The idle timeout, so that the client knows when to stop reusing a
      // pooled connection (Note [Idle connections]).
      ts::Writer w(status(Status::kOk), 8);
      w.i64(limits_.idle_timeout.count());
      reply(conn, std::move(w).finish());
      return true;
    }
    case Command::kSet: {
      if (!room(0)) {
        return false;
      }
      map_[request.key].assign(request.value.data, request.value.data + request.value.size);
      reply(conn, ts::Writer(status(Status::kOk)).finish());
      notify(request.key);
      return true;
    }
    case Command::kGet:
    case Command::kWait: {
      std::vector<std::string> keys = request.command == Command::kGet
          ? std::vector<std::string>{request.key}
          : std::move(request.keys);
      const bool ready =
          std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return has_key(k); });
      Waiter waiter{
          request.command, std::move(keys), SteadyClock::now() + milliseconds(request.number)};
      if (!ready) {
        park(id, conn, std::move(waiter));
        return true;
      }
      if (request.command == Command::kWait) {
        reply(conn, ts::Writer(status(Status::kOk)).finish()); // within the reserve
        return true;
      }
      // A get's value was not reserved for: without room, it waits parked,
      // holding no buffer, and is answered in its turn (try_answer).
      const size_t body_bytes = 4 + map_.at(request.key).size();
      if (!make_room(id, conn, ts::kHeaderBytes + body_bytes, queued, Throttle::kAnswer)) {
        park(id, conn, std::move(waiter));
        return true;
      }
      ts::Writer w(status(Status::kOk), body_bytes);
      w.bytes(map_.at(request.key));
      reply(conn, std::move(w).finish());
      return true;
    }
    case Command::kAdd: {
      // A counter is at most 20 characters, and a message quotes at most 32
      // of a value: 64 bytes give the same outcome as the whole value
      // without copying a large one.
      std::optional<std::vector<uint8_t>> current;
      auto it = map_.find(request.key);
      if (it != map_.end()) {
        const size_t n = std::min<size_t>(it->second.size(), 64);
        current.emplace(it->second.begin(), it->second.begin() + static_cast<std::ptrdiff_t>(n));
      }
      int64_t result = 0;
      try {
        result = add_to_counter("TCPStore add", request.key, current, request.number);
      } catch (const c10::Error& e) {
        std::string message = e.what_without_backtrace();
        // The message quotes the key and a little of the value: it fits the
        // reserve, but is cut to it should a c10 version say more.
        message.resize(std::min(message.size(), conn.reply_room - ts::kHeaderBytes - 4));
        if (!room(4 + message.size())) {
          return false;
        }
        ts::Writer w(status(Status::kBadRequest), 4 + message.size());
        w.bytes(message);
        reply(conn, std::move(w).finish());
        return true;
      }
      if (!room(8)) {
        return false;
      }
      map_[request.key] = counter_bytes(result);
      ts::Writer w(status(Status::kOk), 8);
      w.i64(result);
      reply(conn, std::move(w).finish());
      notify(request.key);
      return true;
    }
    case Command::kCompareSet: {
      // The outcome of compare_set_outcome (store_util.h), on views: the
      // result is the value held afterwards, or `expected` for a missing key.
      const ts::ByteView expected = request.expected;
      const ts::ByteView desired = request.value;
      auto it = map_.find(request.key);
      bool swap = false;
      ts::ByteView result;
      if (it == map_.end()) {
        swap = expected.size == 0;
        result = swap ? desired : expected;
      } else {
        const std::vector<uint8_t>& current = it->second;
        swap = current.size() == expected.size &&
            (expected.size == 0 || std::memcmp(current.data(), expected.data, expected.size) == 0);
        result = swap ? desired : ts::ByteView{current.data(), current.size()};
      }
      if (!room(4 + result.size)) {
        return false;
      }
      ts::Writer w(status(Status::kOk), 4 + result.size);
      w.bytes(result.data, result.size);
      reply(conn, std::move(w).finish());
      if (swap) {
        map_[request.key].assign(desired.data, desired.data + desired.size);
        notify(request.key);
      }
      return true;
    }
    case Command::kCheck: {
      if (!room(1)) {
        return false;
      }
      const bool all = std::all_of(
          request.keys.begin(), request.keys.end(), [&](const std::string& k) { return has_key(k); });
      ts::Writer w(status(Status::kOk), 1);
      w.u8(all ? 1 : 0);
      reply(conn, std::move(w).finish());
      return true;
    }
    case Command::kDeleteKey: {
      if (!room(1)) {
        return false;
      }
      ts::Writer w(status(Status::kOk), 1);
      w.u8(map_.erase(request.key) > 0 ? 1 : 0);
      reply(conn, std::move(w).finish());
      return true;
    }
    case Command::kNumKeys: {
      if (!room(8)) {
        return false;
      }
      ts::Writer w(status(Status::kOk), 8);
      w.i64(static_cast<int64_t>(map_.size()));
      reply(conn, std::move(w).finish());
      return true;
    }
  }
  refuse(conn, "unhandled command"); // parse_request let it through
  return false;
}

void TCPStoreServerLoop::reply(Connection& conn, std::vector<uint8_t> message) {
  // Out of the request's reply reserve first; room for the rest was made.
  const size_t bytes = message.capacity();
  const size_t reserved = std::min(bytes, conn.reply_room);
  conn.reply_room -= reserved;
  release(conn.in_charge, reserved);
  charge(conn.out_charge, bytes);
  conn.out.push_back(std::move(message));
  flush(conn);
}

void TCPStoreServerLoop::flush(Connection& conn) {
  while (conn.output_pending()) {
    const std::vector<uint8_t>& first = conn.out.front();
    const ssize_t n = ::send(conn.socket.fd(), first.data() + conn.out_pos,
                             first.size() - conn.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      conn.last_activity = SteadyClock::now();
      conn.out_pos += static_cast<size_t>(n);
      if (conn.out_pos == first.size()) {
        const size_t bytes = first.capacity();
        conn.out.pop_front();
        conn.out_pos = 0;
        release(conn.out_charge, bytes);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return; // epoll tells us when there is room.
    }
    conn.closing = true; // The client is gone.
    return;
  }
  if (conn.close_after_output) {
    conn.closing = true;
  }
}

void TCPStoreServerLoop::refuse(Connection& conn, const std::string& why) {
  warnings_.warn(
      "TCPStore server: refused a message from " + conn.peer +
      " and dropped its connection: " + why);
  conn.closing = true;
}

void TCPStoreServerLoop::park(uint64_t id, Connection& conn, Waiter waiter) {
  conn.waiter = std::move(waiter);
  watch_missing(id, *conn.waiter);
}

void TCPStoreServerLoop::watch_missing(uint64_t id, Waiter& waiter) {
  std::vector<const std::string*> missing;
  for (const auto& key : waiter.keys) {
    if (!has_key(key)) {
      missing.push_back(&key);
    }
  }
  // A key named twice in one wait is watched once.
  const auto by_value = [](const std::string* a, const std::string* b) { return *a < *b; };
  const auto same = [](const std::string* a, const std::string* b) { return *a == *b; };
  std::sort(missing.begin(), missing.end(), by_value);
  missing.erase(std::unique(missing.begin(), missing.end(), same), missing.end());
  for (const std::string* key : missing) {
    watchers_[*key].push_back(id);
  }
  waiter.unseen = missing.size();
}

void TCPStoreServerLoop::unwatch(uint64_t id, const Waiter& waiter) {
  // Keys set since are no longer in watchers_: one lookup each.
  for (const auto& key : waiter.keys) {
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
}

void TCPStoreServerLoop::unpark(uint64_t id, Connection& conn) {
  if (!conn.waiter.has_value()) {
    return;
  }
  unwatch(id, *conn.waiter);
  conn.waiter.reset();
}

void TCPStoreServerLoop::notify(const std::string& key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) {
    return;
  }
  const std::vector<uint64_t> ids = std::move(it->second);
  watchers_.erase(it);
  for (const uint64_t id : ids) {
    auto conn_it = connections_.find(id);
    if (conn_it == connections_.end() || !conn_it->second.waiter.has_value()) {
      continue;
    }
    Connection& conn = conn_it->second;
    Waiter& waiter = *conn.waiter;
    if (waiter.unseen > 0) {
      --waiter.unseen;
    }
    if (waiter.unseen > 0 || conn.throttle != Throttle::kNone) {
      continue; // A throttled waiter is answered in its turn.
    }
    if (try_answer(id, conn, /*queued=*/false)) {
      resumed_.push_back(id);
    }
  }
}

bool TCPStoreServerLoop::try_answer(uint64_t id, Connection& conn, bool queued) {
  const Waiter& waiter = *conn.waiter;
  std::vector<std::string> missing;
  for (const auto& key : waiter.keys) {
    if (!has_key(key)) {
      missing.push_back(key);
    }
  }
  if (!missing.empty() && SteadyClock::now() < waiter.deadline) {
    // Not ready after all (a key was deleted after it was set): back to
    // waiting, for the keys missing now.
    unthrottle(id, conn);
    unwatch(id, *conn.waiter);
    watch_missing(id, *conn.waiter);
    return false;
  }
  size_t body_bytes = 0;
  if (!missing.empty()) {
    body_bytes = 4;
    for (const auto& key : missing) {
      body_bytes += 4 + key.size();
    }
  } else if (waiter.command == ts::Command::kGet) {
    body_bytes = 4 + map_.at(waiter.keys.front()).size();
  }
  if (!make_room(id, conn, ts::kHeaderBytes + body_bytes, queued, Throttle::kAnswer)) {
    return false;
  }
  std::vector<uint8_t> message;
  if (!missing.empty()) {
    ts::Writer w(static_cast<uint8_t>(ts::Status::kTimedOut), body_bytes);
    w.keys(missing);
    message = std::move(w).finish();
  } else {
    ts::Writer w(static_cast<uint8_t>(ts::Status::kOk), body_bytes);
    if (waiter.command == ts::Command::kGet) {
      w.bytes(map_.at(waiter.keys.front()));
    }
    message = std::move(w).finish();
  }
  unpark(id, conn);
  conn.last_activity = SteadyClock::now(); // the idle clock starts again
  reply(conn, std::move(message));
  return true;
}

SteadyClock::time_point TCPStoreServerLoop::deadline_of(const Connection& conn) const {
  if (!conn.greeted) {
    return after(conn.accepted_at, limits_.handshake_timeout);
  }
  if (conn.throttle != Throttle::kNone) {
    return SteadyClock::time_point::max(); // woken by released memory
  }
  if (conn.waiter.has_value()) {
    return conn.waiter->deadline;
  }
  return after(conn.last_activity, limits_.idle_timeout);
}

void TCPStoreServerLoop::expire(SteadyClock::time_point now) {
  for (auto& [id, conn] : connections_) {
    if (conn.closing || deadline_of(conn) > now) {
      continue;
    }
    if (!conn.greeted) {
      warnings_.warn(
          "TCPStore server: closed the connection of " + conn.peer +
          ": no handshake within " + std::to_string(limits_.handshake_timeout.count()) + " ms");
      conn.closing = true;
    } else if (conn.waiter.has_value()) {
      if (try_answer(id, conn, /*queued=*/false)) {
        resumed_.push_back(id);
      }
    } else {
      // Idle: quietly, since a client holding a TCPStore it no longer uses
      // leaves its pooled connections so (Note [Idle connections]).
      conn.closing = true;
    }
  }
}

} // namespace internal

TCPStoreServer::TCPStoreServer(int port) : TCPStoreServer(TCPStoreServerOptions().port(port)) {}

TCPStoreServer::TCPStoreServer(TCPStoreServerOptions options) {
  int port = options.port();
  DDP_CHECK(
      port >= 0 && port <= 65535,
      "TCPStoreServer: port must be in [0, 65535] (got ", port, ")");
  DDP_CHECK(
      options.handshake_timeout().count() > 0,
      "TCPStoreServer: handshake_timeout must be positive (got ",
      options.handshake_timeout().count(), " ms)");
  DDP_CHECK(
      options.idle_timeout().count() > 0, "TCPStoreServer: idle_timeout must be positive (got ",
      options.idle_timeout().count(), " ms)");
  DDP_CHECK(
      options.max_buffered_bytes() >= kTCPStoreMinBufferedBytes,
      "TCPStoreServer: max_buffered_bytes must be at least kTCPStoreMinBufferedBytes (",
      kTCPStoreMinBufferedBytes, " bytes: the largest request with its reply, and the reserve "
      "for small messages) (got ", options.max_buffered_bytes(), ")");
  internal::TCPStoreServerLoop::Limits limits{
      internal::tcp_store::store_token(options.token()), options.handshake_timeout(),
      options.idle_timeout(), static_cast<size_t>(options.max_buffered_bytes())};
  internal::Socket listener = internal::listen_on(port, &port_);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    throw IoError("TCPStore server: pipe2(): " + internal::errno_string(errno));
  }
  loop_ = std::make_shared<internal::TCPStoreServerLoop>(
      std::move(listener), internal::Socket(pipe_fds[0]), internal::Socket(pipe_fds[1]),
      std::move(limits));
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

int64_t TCPStoreServer::buffered_bytes() const {
  return loop_->buffered();
}

int64_t TCPStoreServer::peak_buffered_bytes() const {
  return loop_->peak_buffered();
}

} // namespace ddp
