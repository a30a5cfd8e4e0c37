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
/// Thread-safety: every method is safe to call from any thread. Destroying
/// the server stops its thread (with a deadline) and closes every client's
/// connection, which makes those clients throw IoError.
class TCPStoreServer {
 public:
  /// Listens on `port` (0 picks a free one) and starts serving. Throws
  /// IoError when it cannot listen (e.g. the port is taken).
  explicit TCPStoreServer(int port = 0);
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
