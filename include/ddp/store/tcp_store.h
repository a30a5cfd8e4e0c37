#pragma once

/// The TCP key-value store through which the ranks of a job meet: rank 0 (or
/// a standalone server) serves it, every rank is a client.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/arg.h>

#include <ddp/store/store.h>

namespace ddp {

namespace internal {
class TCPStoreServerLoop;
class TCPStoreClient;
} // namespace internal

/// The smallest TCPStoreServerOptions::max_buffered_bytes: room for the
/// largest request (a compare_set of two 64 MiB values and a 64 KiB key) and
/// its reply (a 64 MiB value) at once, beside the 64 MiB that the server
/// keeps for small messages (see TCPStoreServer).
constexpr int64_t kTCPStoreMinBufferedBytes =
    (int64_t{64} << 20) + (5 + (4 + (int64_t{64} << 10)) + 2 * (4 + (int64_t{64} << 20))) +
    (5 + 4 + (int64_t{64} << 20));

/// Options of a TCPStoreServer: the port, and the bounds that keep a hostile
/// or broken client from exhausting its memory (see TCPStoreServer).
/// Example:
/// `ddp::TCPStoreServer server(ddp::TCPStoreServerOptions().port(29500).token("s3cret"));`
struct TCPStoreServerOptions {
  /// The port to listen on; 0 picks a free one (read it back with
  /// TCPStoreServer::port()). Default: 0.
  TORCH_ARG(int, port) = 0;
  /// The shared secret that every client's handshake must carry (at most 256
  /// bytes); a client without it is refused. std::nullopt reads the
  /// environment variable DDP_STORE_TOKEN; an empty token (or an unset
  /// variable) admits every client. Default: std::nullopt.
  TORCH_ARG(std::optional<std::string>, token) = std::nullopt;
  /// How long a new connection may take to complete its handshake (a ddp
  /// client does in one round trip) before the server closes it. Longer
  /// values than 30 days count as 30 days. Default: 5 s.
  TORCH_ARG(std::chrono::milliseconds, handshake_timeout) = std::chrono::seconds(5);
  /// How long a connection may stay silent (no byte received or sent) before
  /// the server closes it. A connection parked in a get or wait is never
  /// idle, however long it waits, and ddp clients stop reusing a pooled
  /// connection after half this time, which the server tells them. Longer
  /// values than 30 days count as 30 days. Default: 10 minutes.
  TORCH_ARG(std::chrono::milliseconds, idle_timeout) = std::chrono::minutes(10);
  /// The most bytes the server holds in all connections' input and output
  /// buffers together; at least kTCPStoreMinBufferedBytes (about 256 MiB).
  /// Default: 512 MiB.
  TORCH_ARG(int64_t, max_buffered_bytes) = int64_t{512} << 20;
};

/// Options of a TCPStore.
/// Example:
/// `ddp::TCPStore store("localhost", ddp::TCPStoreOptions().port(0).is_server(true));`
struct TCPStoreOptions {
  /// The server's port. With is_server, 0 lets the server pick a free port
  /// (read it back with TCPStore::port()); a client needs the real port.
  /// Default: 29500.
  TORCH_ARG(int, port) = 29500;
  /// Whether this object also runs the server, on a background thread, for
  /// as long as it lives. Default: false.
  TORCH_ARG(bool, is_server) = false;
  /// Deadline of connecting (a late server is retried with backoff until
  /// then) and of every blocking call. Default: kDefaultStoreTimeout (300 s).
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultStoreTimeout;
  /// With is_server: the constructor returns only once this many TCPStore
  /// objects, this one included (so: the world size), have connected, and
  /// throws TimeoutError after `timeout`. Clients ignore it.
  /// Default: std::nullopt (do not wait).
  TORCH_ARG(std::optional<int64_t>, num_workers) = std::nullopt;
  /// The shared secret this client sends in its handshake and, with
  /// is_server, that the server requires (see TCPStoreServerOptions::token).
  /// std::nullopt reads DDP_STORE_TOKEN; empty: none. Default: std::nullopt.
  TORCH_ARG(std::optional<std::string>, token) = std::nullopt;
  /// With is_server: see TCPStoreServerOptions. Default: 5 s.
  TORCH_ARG(std::chrono::milliseconds, handshake_timeout) = std::chrono::seconds(5);
  /// With is_server: see TCPStoreServerOptions. Default: 10 minutes.
  TORCH_ARG(std::chrono::milliseconds, idle_timeout) = std::chrono::minutes(10);
  /// With is_server: see TCPStoreServerOptions. Default: 512 MiB.
  TORCH_ARG(int64_t, max_buffered_bytes) = int64_t{512} << 20;
};

/// The server side of the TCPStore, runnable on its own (by a launcher, say)
/// rather than by a rank. It listens on every interface (IPv6 and IPv4) and
/// serves any number of clients from one background thread with a poll()
/// loop; a `get` or `wait` of a missing key parks that client until the key
/// is set or its deadline passes, without holding up the others.
///
/// Example:
/// `ddp::TCPStoreServer server(0); launch_workers(server.port());`
///
/// Bounds. Whoever can reach the port can open connections, so what a
/// connection can make the server hold is bounded (TCPStoreServerOptions):
/// - Before its handshake, a connection may send only the handshake (a hello,
///   at most 274 bytes, so that the server holds under 350 bytes for it);
///   any other byte gets it dropped, and so does not completing the
///   handshake within handshake_timeout (5 s). With a token, a client whose
///   handshake lacks it is refused there.
/// - All connections' input and output buffers together hold at most
///   max_buffered_bytes (512 MiB). A request is charged, with room for its
///   reply, when its header arrives; a reply of a stored value when it is
///   made. A message that does not fit waits, its connection unread, until
///   others' buffers drain (the oldest first). Messages up to 128 KiB (every
///   ordinary store call) may use the last 64 MiB, which larger ones may
///   not, so that large messages can never stall the small ones. Should
///   waiting requests ever hold every buffered byte, so that none could go
///   on, the oldest is refused (its client gets IoError).
/// - A connection silent for idle_timeout (10 minutes) is closed, unless it
///   is parked in a get or wait.
/// The map itself and the keys of parked waiters are the store's contents,
/// not buffers: only clients past the handshake can grow them, which is what
/// a token restricts.
///
/// Thread-safety: every method is safe to call from any thread. Destroying
/// the server stops its thread (with a deadline) and closes every client's
/// connection, which makes those clients throw IoError.
class TCPStoreServer {
 public:
  /// Listens on `port` (0 picks a free one) with the default options and
  /// starts serving. Throws IoError when it cannot listen (e.g. the port is
  /// taken).
  explicit TCPStoreServer(int port = 0);
  /// Listens on `options.port()` and starts serving. Throws c10::Error for
  /// bad options, IoError when it cannot listen.
  explicit TCPStoreServer(TCPStoreServerOptions options);
  /// Stops the server thread, waiting for it for 5 seconds at most.
  ~TCPStoreServer() noexcept;

  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  /// The port it listens on (the one it picked when asked for 0).
  int port() const;

  /// Waits until `count` TCPStore objects have connected since the server
  /// started (each counts once however many connections it opens, and still
  /// counts after it disconnects). Throws TimeoutError after `timeout`, and
  /// IoError if the server thread has failed.
  void wait_for_workers(int64_t count, std::chrono::milliseconds timeout);

  /// How many TCPStore objects have connected since the server started.
  int64_t num_workers_connected() const;

  /// The bytes its connections' buffers hold now, as charged against
  /// max_buffered_bytes (for monitoring and tests).
  int64_t buffered_bytes() const;
  /// The most buffered_bytes() has been since the server started.
  int64_t peak_buffered_bytes() const;

 private:
  // Shared with the server thread, which may outlive this object when it
  // fails to stop in time (the thread is then detached).
  std::shared_ptr<internal::TCPStoreServerLoop> loop_;
  std::thread thread_;
  int port_ = 0;
};

/// A Store served over TCP by a TCPStoreServer, which this object runs itself
/// when `options.is_server()` (the usual arrangement: rank 0 serves).
///
/// Example:
/// `auto store = std::make_shared<ddp::TCPStore>("10.0.0.1",
///     ddp::TCPStoreOptions().port(29500).is_server(rank == 0).num_workers(world_size));`
///
/// Each blocking call runs on a connection of its own, taken from a small
/// pool (opened on demand), so a thread blocked in `get` never holds up
/// another thread's `set` through the same object. Keys are at most 64 KiB
/// and values at most 64 MiB (c10::Error beyond).
///
/// Errors: TimeoutError when the deadline passes (naming the keys, the
/// timeout and the server's address); IoError when the connection to the
/// server fails or the server is gone, as soon as that is seen.
///
/// Thread-safety: safe to call from many threads at once.
class TCPStore : public Store {
 public:
  /// Connects to the server at `host`:`options.port()` (starting it first
  /// when `options.is_server()`), retrying with exponential backoff until
  /// `options.timeout()`. `host` is a name ("localhost"), an IPv4 or an IPv6
  /// address. Throws c10::Error for bad options, TimeoutError when no server
  /// answered in time, IoError when the server cannot listen.
  TCPStore(std::string host, TCPStoreOptions options = {});
  /// Closes this object's connections, then stops its server if it runs one.
  ~TCPStore() override;

  /// See Store::set.
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::set;
  /// See Store::get.
  std::vector<uint8_t> get(const std::string& key) override;
  /// See Store::add.
  int64_t add(const std::string& key, int64_t delta) override;
  /// See Store::compare_set.
  std::vector<uint8_t> compare_set(
      const std::string& key,
      const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override;
  /// See Store::check.
  bool check(const std::vector<std::string>& keys) override;
  /// See Store::wait.
  void wait(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) override;
  using Store::wait;
  /// See Store::delete_key.
  bool delete_key(const std::string& key) override;
  /// See Store::num_keys.
  int64_t num_keys() override;

  /// The server's host, as given.
  const std::string& host() const;
  /// The server's port: the real one, also when the options said 0.
  int port() const;
  /// The server this object runs, or null when it is only a client. The
  /// pointer is valid while this object lives.
  TCPStoreServer* server() const;

 private:
  const std::string host_;
  int port_ = 0;
  // Declared before client_ so that the client's connections close first.
  std::unique_ptr<TCPStoreServer> server_;
  std::unique_ptr<internal::TCPStoreClient> client_;
};

} // namespace ddp
