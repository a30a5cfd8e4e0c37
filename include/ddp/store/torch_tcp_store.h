#pragma once

/// A client of PyTorch's own TCPStore server (torch.distributed.TCPStore),
/// such as the one that torchrun's agent serves to its workers.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/arg.h>

#include <ddp/store/store.h>

namespace ddp {

namespace internal {
class TorchTCPStoreClient;
} // namespace internal

/// Options of a TorchTCPStore.
/// Example:
/// `ddp::TorchTCPStore store("10.0.0.1", ddp::TorchTCPStoreOptions().port(29500));`
struct TorchTCPStoreOptions {
  /// The server's port, 1 to 65535. Default: 29500 (torchrun's MASTER_PORT).
  TORCH_ARG(int, port) = 29500;
  /// Deadline of connecting (a late server is retried with backoff until
  /// then) and of every blocking call. Default: kDefaultStoreTimeout (300 s).
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultStoreTimeout;
};

/// The two numberings of PyTorch's TCPStore protocol, which a TorchTCPStore
/// finds out by itself when it connects.
enum class TorchStoreProtocol {
  /// No handshake: PyTorch 1.x (1.13 tested) and the first 2.x releases.
  kUnvalidated,
  /// Every connection opens with a VALIDATE message: later 2.x releases
  /// (2.11 tested), with either of their servers (libuv or classic).
  kValidated,
};

/// A Store kept by a PyTorch TCPStore server, which this object only talks to
/// as a client: it speaks PyTorch's wire protocol, not ddp's (TCPStore), and
/// never serves. Its use is to share the store that torchrun's agent already
/// serves at MASTER_ADDR:MASTER_PORT (see init_process_group), or one served
/// by a torch.distributed program.
///
/// Example:
/// `auto store = std::make_shared<ddp::TorchTCPStore>(
///     "10.0.0.1", ddp::TorchTCPStoreOptions().port(29500));`
///
/// Keys are shared with PyTorch's clients: like them, this client puts "/"
/// in front of every key on the wire, so `set("k", ...)` here and
/// `store.set("k", ...)` in Python name the same entry. Keys are at most 8191
/// bytes and values at most 8 MiB, the limits of PyTorch's libuv server
/// (c10::Error beyond).
///
/// Where PyTorch's server decides, its semantics hold: `add` parses the old
/// value as std::stoll does (" 12x" counts as 12, where ddp's own stores
/// refuse it), and `num_keys` counts every key on the server, the agent's and
/// torch.distributed's included. PyTorch's `set` has no reply, so `set`
/// here sends a key count behind it and returns once that is answered: the
/// value is stored when `set` returns, as with every ddp store.
///
/// Each blocking call runs on a connection of its own, taken from a small
/// pool (opened on demand), so a thread blocked in `get` never holds up
/// another thread's `set`. The deadlines are kept by this client, since
/// PyTorch's server has none: a `get` or `wait` that times out closes its
/// connection, which makes the server forget the wait.
///
/// Errors: TimeoutError when a deadline passes (naming the keys, the timeout
/// and the server's address); IoError when the connection fails, the server
/// is gone or its reply is malformed or oversized, as soon as that is seen;
/// c10::Error for misuse, and for `add` to a value that is not a number (the
/// server drops the connection; this client then reads the value to say so).
///
/// Thread-safety: safe to call from many threads at once.
class TorchTCPStore : public Store {
 public:
  /// Connects to the server at `host`:`options.port()`, retrying with
  /// exponential backoff until `options.timeout()`, and finds out which
  /// protocol it speaks. `host` is a name ("localhost"), an IPv4 or an IPv6
  /// address. Throws c10::Error for bad options, TimeoutError when no server
  /// answered in time, IoError when the server answers unlike a PyTorch
  /// TCPStore.
  TorchTCPStore(std::string host, TorchTCPStoreOptions options = {});
  /// Closes this object's connections; the server and its keys stay.
  ~TorchTCPStore() override;

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
  /// See Store::num_keys. Counts every key on the server (see the class).
  int64_t num_keys() override;

  /// The server's host, as given.
  const std::string& host() const;
  /// The server's port.
  int port() const;
  /// The protocol the server was found to speak.
  TorchStoreProtocol protocol() const;

 private:
  // Waits for `keys` on behalf of `op` ("get" or "wait").
  void wait_for(
      const char* op,
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout);
  // The value of `key`, which must exist (no wait first).
  std::vector<uint8_t> read_now(const std::string& key);

  const std::string host_;
  const int port_;
  std::unique_ptr<internal::TorchTCPStoreClient> client_;
};

} // namespace ddp
