// TCPStore: a key-value store served over TCP.
//
// How it works
// ------------
// One *server* (TCPStoreServer, tcp_store_server.cpp) holds the map. It runs
// a single thread around epoll: the listening socket, a wake-up pipe (how
// the destructor stops it) and every client connection. Each *client*
// (TCPStore, below) talks to it over connections that carry one request and
// then one reply at a time.
//
// Messages. Every request and every reply is a 5-byte *header* followed by a
// *body*:
//
//   header:  u8 kind | u32 body_length        (integers are big-endian)
//
// where kind is a Command in requests and a Status in replies. Inside bodies,
// `bytes` is a u32 length then that many bytes, `keys` is a u32 count then
// that many `bytes`, i64 is two's complement.
//
//   command       request body                      reply body (Status kOk)
//   1 hello       u32 magic "DDPS", u32 version,    i64 idle_timeout_ms
//                 u8 flags (1: count as a worker),
//                 bytes token (empty: none)
//   2 set         bytes key, bytes value            (empty)
//   3 get         bytes key, i64 timeout_ms         bytes value
//   4 add         bytes key, i64 delta              i64 new value
//   5 compare_set bytes key, bytes expected,        bytes value held afterwards
//                 bytes desired
//   6 check       keys                              u8 all exist
//   7 wait        i64 timeout_ms, keys              (empty)
//   8 delete_key  bytes key                         u8 existed
//   9 num_keys    (empty)                           i64 count
//
// A get or wait whose keys are missing when it arrives is *parked*: the
// server notes the connection under each of its keys and goes on serving
// everyone else; every write of a key answers the parked waiters whose keys
// now all exist. When a waiter's timeout_ms passes first, the server answers
// Status kTimedOut with the keys still missing. A parked connection sends
// nothing until answered, so its replies stay in order. Status kBadRequest
// (body: bytes message) answers a well-formed request that cannot be done,
// such as add to a key whose value is not a number; the client raises it as
// c10::Error.
//
// Limits. Keys are at most 64 KiB, values 64 MiB, a key list 64 Ki keys and
// 16 MiB, so each command has a largest possible body (max_request_body). The
// server reads a header first and *refuses* the message (logs a warning,
// drops that connection, keeps serving the others) when the command byte is
// unknown or the length is over its command's limit, before reading or
// allocating the body; and likewise when a field inside the body is longer
// than its limit or than the body, or the body has bytes left over. The
// first request on a connection must be hello, whose magic and version the
// server checks; until then nothing else is read (see "Bounds" at the top of
// tcp_store_budget.cpp, which also bounds the server's buffers, and Note
// [Idle connections] in tcp_store_server.cpp, which closes idle
// connections). A server with a token answers a hello without it with
// Status kRefused (body: bytes message) and closes the connection; the
// client raises IoError and does not retry. The hello's reply carries the
// server's idle timeout, so that the client can stop reusing a pooled
// connection before the server would close it.
//
// Clients. A TCPStore connects with retries and exponential backoff (10 ms
// doubling to 1 s) until its timeout, so a server that starts late is found.
// Every send and receive waits with poll() against a deadline: the store's
// timeout for ordinary requests; for get and wait, their timeout (the server
// answers kTimedOut then) plus a grace period, after which the client gives
// up on a silent server and drops the connection. A closed or reset
// connection is an IoError at once, so a client parked in wait learns of a
// dead server as soon as the kernel does. Each call takes a connection from a
// pool and returns it afterwards; a call that finds the pool empty opens a
// new connection, so threads of one process never queue behind another's
// parked wait. Only the first connection of a TCPStore counts as a worker.
//
// Files. The wire protocol (Writer, Reader, the server's checks) is in
// tcp_store_protocol.{h,cpp}; the server in tcp_store_server.cpp, its buffer
// budget in tcp_store_budget.cpp, and the class they share in
// tcp_store_server_loop.h; this file holds the client: its connection pool
// (TCPStoreClient) and TCPStore.

#include <ddp/store/tcp_store.h>

#include <ddp/comm/error.h>

#include "store/socket.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"
#include "internal/check.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <poll.h>
#include <thread>

namespace ddp {
namespace internal {

namespace ts = tcp_store;

// ---- Client ------------------------------------------------------------------

namespace {

// How much longer than a get/wait timeout a client waits for the server's
// kTimedOut answer before it gives up on the server.
constexpr std::chrono::milliseconds kReplyGrace{2000};
constexpr std::chrono::milliseconds kFirstBackoff{10};
constexpr std::chrono::milliseconds kMaxBackoff{1000};
// Idle connections a client keeps for reuse; more are closed.
constexpr size_t kMaxIdleConnections = 8;
// Longest refusal message a client reads from a hello reply.
constexpr uint32_t kMaxRefusalBytes = 4096;

// Whether a pooled connection, which should have nothing to read, has been
// closed (or written to) by the server since it was put back.
bool stale(const Socket& socket) {
  pollfd p{socket.fd(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) != 0;
}

} // namespace

// The client side of one TCPStore: a pool of connections to the server.
// Thread-safety: safe to call from many threads; each call uses a connection
// of its own.
class TCPStoreClient {
 public:
  struct Reply {
    ts::Status status;
    std::vector<uint8_t> body;
  };

  // `token` is sent in every hello; empty for none.
  TCPStoreClient(std::string host, int port, std::string token)
      : host_(std::move(host)),
        port_(port),
        address_(host_port(host_, port)),
        token_(std::move(token)) {}

  // Opens the first connection, the one counted as a worker, retrying until
  // `timeout`.
  void connect(std::chrono::milliseconds timeout) {
    Socket socket = open_connection("connect", /*worker=*/true, timeout);
    release(std::move(socket));
  }

  // Sends `request` and returns the reply, waiting until `deadline`; a
  // connection is opened within `connect_timeout` if none is idle. Throws
  // TimeoutError(`timeout_message`) when the deadline passes, IoError when
  // the connection fails.
  Reply call(
      const char* op,
      const std::vector<uint8_t>& request,
      std::chrono::milliseconds connect_timeout,
      SteadyClock::time_point deadline,
      const std::string& timeout_message) {
    Socket socket = acquire(op, connect_timeout);
    IoResult sent = send_all(socket.fd(), request.data(), request.size(), deadline);
    if (sent.status != IoStatus::kOk) {
      fail(op, sent, timeout_message);
    }
    uint8_t header[ts::kHeaderBytes];
    IoResult got = recv_all(socket.fd(), header, sizeof(header), deadline);
    if (got.status != IoStatus::kOk) {
      fail(op, got, timeout_message);
    }
    if (header[0] > static_cast<uint8_t>(ts::Status::kBadRequest)) {
      throw malformed(op, "unknown status byte " + std::to_string(header[0]));
    }
    const uint32_t length = ts::body_length(header);
    if (length > ts::kMaxReplyBody) {
      throw malformed(op, "a reply body of " + std::to_string(length) + " bytes");
    }
    Reply reply{static_cast<ts::Status>(header[0]), std::vector<uint8_t>(length)};
    got = recv_all(socket.fd(), reply.body.data(), length, deadline);
    if (got.status != IoStatus::kOk) {
      fail(op, got, timeout_message);
    }
    release(std::move(socket));
    return reply;
  }

  IoError malformed(const char* op, const std::string& what) const {
    return IoError(
        std::string("TCPStore ") + op + ": malformed reply from the store server at " + address_ +
        ": " + what);
  }

  const std::string& address() const {
    return address_;
  }

 private:
  [[noreturn]] void fail(const char* op, const IoResult& result, const std::string& timeout_message) const {
    if (result.status == IoStatus::kTimedOut) {
      throw TimeoutError(timeout_message + " (the server did not answer in time)");
    }
    throw IoError(
        std::string("TCPStore ") + op + ": lost the connection to the store server at " +
        address_ + ": " + describe(result));
  }

  // A pooled connection, or a new one. A pooled connection is reused only
  // while it has been idle for less than half the server's idle timeout, so
  // that the server never closes one under a request (see Note [Idle
  // connections] in tcp_store_server.cpp); older ones, and any the server
  // closed anyway, are dropped here.
  Socket acquire(const char* op, std::chrono::milliseconds timeout) {
    const auto max_idle = std::chrono::milliseconds(server_idle_timeout_ms_.load()) / 2;
    const auto now = SteadyClock::now();
    std::vector<Socket> dropped; // closed outside the lock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!idle_.empty()) {
        Pooled pooled = std::move(idle_.back());
        idle_.pop_back();
        if (now - pooled.since < max_idle && !stale(pooled.socket)) {
          return std::move(pooled.socket);
        }
        dropped.push_back(std::move(pooled.socket));
      }
    }
    dropped.clear();
    return open_connection(op, /*worker=*/false, timeout);
  }

  void release(Socket socket) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < kMaxIdleConnections) {
      idle_.push_back(Pooled{std::move(socket), SteadyClock::now()});
    }
  }

  Socket open_connection(const char* op, bool worker, std::chrono::milliseconds timeout) {
    const auto deadline = deadline_after(timeout);
    auto backoff = kFirstBackoff;
    while (true) {
      ConnectResult result = try_connect(host_, port_, deadline);
      if (result.socket.valid()) {
        hello(op, result.socket, worker, deadline);
        connected_once_.store(true);
        return std::move(result.socket);
      }
      if (result.refused && connected_once_.load()) {
        // It was up and now nothing listens: it is gone, not late.
        throw IoError(
            std::string("TCPStore ") + op + ": the store server at " + address_ +
            " refused a new connection; it has stopped (" + result.error + ")");
      }
      const auto now = SteadyClock::now();
      if (now >= deadline) {
        throw TimeoutError(
            std::string("TCPStore ") + op + ": timed out after " +
            std::to_string(timeout.count()) + " ms connecting to the store server at " +
            address_ + " (last error: " + result.error + ")");
      }
      std::this_thread::sleep_for(std::min<SteadyClock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  void hello(const char* op, const Socket& socket, bool worker, SteadyClock::time_point deadline) {
    ts::Writer w(static_cast<uint8_t>(ts::Command::kHello));
    w.u32(ts::kMagic);
    w.u32(ts::kProtocolVersion);
    w.u8(worker ? ts::kHelloWorkerFlag : 0);
    w.bytes(token_);
    const std::vector<uint8_t> message = std::move(w).finish();
    IoResult result = send_all(socket.fd(), message.data(), message.size(), deadline);
    uint8_t header[ts::kHeaderBytes] = {};
    if (result.status == IoStatus::kOk) {
      result = recv_all(socket.fd(), header, sizeof(header), deadline);
    }
    std::vector<uint8_t> body;
    const uint32_t length = ts::body_length(header);
    const bool ok = header[0] == static_cast<uint8_t>(ts::Status::kOk) && length == 8;
    const bool refused =
        header[0] == static_cast<uint8_t>(ts::Status::kRefused) && length <= kMaxRefusalBytes;
    if (result.status == IoStatus::kOk && (ok || refused)) {
      body.resize(length);
      result = recv_all(socket.fd(), body.data(), body.size(), deadline);
    }
    if (result.status == IoStatus::kTimedOut) {
      throw TimeoutError(
          std::string("TCPStore ") + op + ": timed out waiting for the store server at " +
          address_ + " to answer the handshake");
    }
    if (result.status != IoStatus::kOk) {
      throw IoError(
          std::string("TCPStore ") + op + ": the handshake with the store server at " + address_ +
          " failed (" + describe(result) +
          "); is a ddp TCPStore server of the same version listening there?");
    }
    if (refused) {
      throw IoError(
          std::string("TCPStore ") + op + ": the store at " + address_ +
          " refused this client: wrong or missing DDP_STORE_TOKEN");
    }
    if (!ok) {
      throw IoError(
          std::string("TCPStore ") + op + ": " + address_ +
          " answered the handshake unlike a ddp TCPStore server");
    }
    const int64_t idle_ms = ts::Reader(body.data(), body.size()).i64();
    if (idle_ms > 0) {
      server_idle_timeout_ms_.store(idle_ms);
    }
  }

  struct Pooled {
    Socket socket;
    SteadyClock::time_point since;
  };

  const std::string host_;
  const int port_;
  const std::string address_;
  const std::string token_;
  std::atomic<bool> connected_once_{false};
  // The idle timeout the server announced in its last hello reply.
  std::atomic<int64_t> server_idle_timeout_ms_{ts::kMaxTimeoutMs};
  std::mutex mutex_;
  std::vector<Pooled> idle_; // Guarded by mutex_.
};

} // namespace internal

// ---- TCPStore ----------------------------------------------------------------

namespace {

namespace ts = internal::tcp_store;

void check_key(const char* op, const std::string& key) {
  DDP_CHECK(
      key.size() <= ts::kMaxKeyBytes, "TCPStore ", op, ": the key is ", key.size(),
      " bytes, over the limit of ", ts::kMaxKeyBytes);
}

void check_value(const char* op, const char* what, const std::vector<uint8_t>& value) {
  DDP_CHECK(
      value.size() <= ts::kMaxValueBytes, "TCPStore ", op, ": the ", what, " is ",
      value.size(), " bytes, over the limit of ", ts::kMaxValueBytes);
}

void check_keys(const char* op, const std::vector<std::string>& keys) {
  DDP_CHECK(
      keys.size() <= ts::kMaxKeysPerRequest, "TCPStore ", op, ": ", keys.size(),
      " keys, over the limit of ", ts::kMaxKeysPerRequest, " per call");
  size_t bytes = 4;
  for (const auto& key : keys) {
    check_key(op, key);
    bytes += 4 + key.size();
  }
  DDP_CHECK(
      bytes <= ts::kMaxKeyListBytes, "TCPStore ", op, ": the keys take ", bytes,
      " bytes, over the limit of ", ts::kMaxKeyListBytes, " per call");
}

std::chrono::milliseconds check_timeout(const char* op, std::chrono::milliseconds timeout) {
  DDP_CHECK(
      timeout.count() >= 0, "TCPStore ", op, ": timeout must not be negative (got ",
      timeout.count(), " ms)");
  return timeout;
}

} // namespace

TCPStore::TCPStore(std::string host, TCPStoreOptions options)
    : Store(options.timeout()), host_(std::move(host)), port_(options.port()) {
  DDP_CHECK(!host_.empty(), "TCPStore: the host is empty");
  DDP_CHECK(
      port_ >= 0 && port_ <= 65535, "TCPStore: port must be in [0, 65535] (got ", port_, ")");
  DDP_CHECK(
      port_ != 0 || options.is_server(),
      "TCPStore: port 0 (let the server pick) needs is_server(true); a client must be given the "
      "server's real port");
  DDP_CHECK(
      !options.num_workers().has_value() || *options.num_workers() >= 1,
      "TCPStore: num_workers must be at least 1 (got ", options.num_workers().value_or(0), ")");
  const std::string token = ts::store_token(options.token());
  if (options.is_server()) {
    server_ = std::make_unique<TCPStoreServer>(TCPStoreServerOptions()
                                                   .port(port_)
                                                   .token(token)
                                                   .handshake_timeout(options.handshake_timeout())
                                                   .idle_timeout(options.idle_timeout())
                                                   .max_buffered_bytes(options.max_buffered_bytes()));
    port_ = server_->port();
  }
  client_ = std::make_unique<internal::TCPStoreClient>(host_, port_, token);
  client_->connect(timeout());
  if (server_ != nullptr && options.num_workers().has_value()) {
    server_->wait_for_workers(*options.num_workers(), timeout());
  }
}

TCPStore::~TCPStore() = default;

const std::string& TCPStore::host() const {
  return host_;
}

int TCPStore::port() const {
  return port_;
}

TCPStoreServer* TCPStore::server() const {
  return server_.get();
}

namespace {

// One request that the server answers at once: its deadline is the store's
// timeout. Throws c10::Error on kBadRequest, IoError on any other status.
internal::TCPStoreClient::Reply simple_call(
    internal::TCPStoreClient& client,
    const char* op,
    const std::vector<uint8_t>& request,
    std::chrono::milliseconds timeout) {
  auto reply = client.call(
      op, request, timeout, internal::deadline_after(timeout),
      std::string("TCPStore ") + op + ": timed out after " + std::to_string(timeout.count()) +
          " ms waiting for the reply of the store server at " + client.address());
  if (reply.status == ts::Status::kBadRequest) {
    ts::Reader r(reply.body.data(), reply.body.size());
    std::string message;
    try {
      message = r.string(ts::kMaxKeyBytes * 4, "message");
    } catch (const ts::ProtocolError& e) {
      throw client.malformed(op, e.what());
    }
    DDP_CHECK(false, message);
  }
  if (reply.status != ts::Status::kOk) {
    throw client.malformed(op, "status " + std::to_string(static_cast<int>(reply.status)));
  }
  return reply;
}

// Parses a reply body with `parse`, turning a ProtocolError into IoError.
template <typename Parse>
auto parse_reply(
    internal::TCPStoreClient& client,
    const char* op,
    const std::vector<uint8_t>& body,
    Parse parse) {
  ts::Reader reader(body.data(), body.size());
  try {
    auto result = parse(reader);
    reader.finish();
    return result;
  } catch (const ts::ProtocolError& e) {
    throw client.malformed(op, e.what());
  }
}

} // namespace

void TCPStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  check_key("set", key);
  check_value("set", "value", value);
  ts::Writer w(static_cast<uint8_t>(ts::Command::kSet));
  w.bytes(key);
  w.bytes(value);
  auto reply = simple_call(*client_, "set", std::move(w).finish(), timeout());
  parse_reply(*client_, "set", reply.body, [](ts::Reader&) { return 0; });
}

std::vector<uint8_t> TCPStore::get(const std::string& key) {
  check_key("get", key);
  const std::chrono::milliseconds timeout = this->timeout();
  ts::Writer w(static_cast<uint8_t>(ts::Command::kGet));
  w.bytes(key);
  w.i64(timeout.count());
  const std::string timeout_message = "TCPStore get: " +
      internal::timed_out_message(timeout, {key}) + " at " + client_->address();
  auto reply = client_->call(
      "get", std::move(w).finish(), timeout,
      internal::deadline_after(timeout) + internal::kReplyGrace, timeout_message);
  if (reply.status == ts::Status::kTimedOut) {
    throw TimeoutError(timeout_message);
  }
  if (reply.status != ts::Status::kOk) {
    throw client_->malformed("get", "status " + std::to_string(static_cast<int>(reply.status)));
  }
  return parse_reply(*client_, "get", reply.body, [](ts::Reader& r) {
    return r.bytes(ts::kMaxValueBytes, "value");
  });
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  check_key("add", key);
  ts::Writer w(static_cast<uint8_t>(ts::Command::kAdd));
  w.bytes(key);
  w.i64(delta);
  auto reply = simple_call(*client_, "add", std::move(w).finish(), timeout());
  return parse_reply(*client_, "add", reply.body, [](ts::Reader& r) { return r.i64(); });
}

std::vector<uint8_t> TCPStore::compare_set(
    const std::string& key,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  check_key("compare_set", key);
  check_value("compare_set", "expected value", expected);
  check_value("compare_set", "desired value", desired);
  ts::Writer w(static_cast<uint8_t>(ts::Command::kCompareSet));
  w.bytes(key);
  w.bytes(expected);
  w.bytes(desired);
  auto reply = simple_call(*client_, "compare_set", std::move(w).finish(), timeout());
  return parse_reply(*client_, "compare_set", reply.body, [](ts::Reader& r) {
    return r.bytes(ts::kMaxValueBytes, "value");
  });
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  check_keys("check", keys);
  ts::Writer w(static_cast<uint8_t>(ts::Command::kCheck));
  w.keys(keys);
  auto reply = simple_call(*client_, "check", std::move(w).finish(), timeout());
  return parse_reply(*client_, "check", reply.body, [](ts::Reader& r) { return r.u8() != 0; });
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  check_keys("wait", keys);
  check_timeout("wait", timeout);
  ts::Writer w(static_cast<uint8_t>(ts::Command::kWait));
  w.i64(timeout.count());
  w.keys(keys);
  const auto message_for = [&](const std::vector<std::string>& missing) {
    return "TCPStore wait: " + internal::timed_out_message(timeout, missing) + " at " +
        client_->address();
  };
  auto reply = client_->call(
      "wait", std::move(w).finish(), this->timeout(),
      internal::deadline_after(timeout) + internal::kReplyGrace, message_for(keys));
  if (reply.status == ts::Status::kTimedOut) {
    const auto missing = parse_reply(*client_, "wait", reply.body, [](ts::Reader& r) { return r.keys(); });
    throw TimeoutError(message_for(missing));
  }
  if (reply.status != ts::Status::kOk) {
    throw client_->malformed("wait", "status " + std::to_string(static_cast<int>(reply.status)));
  }
  parse_reply(*client_, "wait", reply.body, [](ts::Reader&) { return 0; });
}

bool TCPStore::delete_key(const std::string& key) {
  check_key("delete_key", key);
  ts::Writer w(static_cast<uint8_t>(ts::Command::kDeleteKey));
  w.bytes(key);
  auto reply = simple_call(*client_, "delete_key", std::move(w).finish(), timeout());
  return parse_reply(*client_, "delete_key", reply.body, [](ts::Reader& r) { return r.u8() != 0; });
}

int64_t TCPStore::num_keys() {
  ts::Writer w(static_cast<uint8_t>(ts::Command::kNumKeys));
  auto reply = simple_call(*client_, "num_keys", std::move(w).finish(), timeout());
  return parse_reply(*client_, "num_keys", reply.body, [](ts::Reader& r) { return r.i64(); });
}

} // namespace ddp
