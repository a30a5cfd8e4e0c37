#pragma once

// Small POSIX socket helpers for the TCPStore (private header). Every call
// that can block takes a deadline and waits with poll(); sockets are
// non-blocking and close-on-exec, and send with MSG_NOSIGNAL so that a peer
// that went away gives EPIPE rather than a SIGPIPE.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::internal {

using SteadyClock = std::chrono::steady_clock;

/// An owned file descriptor, closed on destruction.
/// Thread-safety: like an int; one owner at a time.
class Socket {
 public:
  Socket() = default;
  /// Takes ownership of `fd` (-1 for none).
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  /// The descriptor, or -1.
  int fd() const {
    return fd_;
  }
  /// Whether a descriptor is held.
  bool valid() const {
    return fd_ >= 0;
  }
  /// Closes the descriptor now.
  void reset();

 private:
  int fd_ = -1;
};

/// How a send or receive ended.
enum class IoStatus {
  kOk,
  /// The deadline passed first.
  kTimedOut,
  /// The peer closed the connection (end of file).
  kClosed,
  /// The system call failed; see `error`.
  kFailed,
};

/// Outcome of send_all / recv_all.
struct IoResult {
  IoStatus status = IoStatus::kOk;
  /// errno when status is kFailed.
  int error = 0;
};

/// "timed out", "the peer closed the connection" or the errno text.
std::string describe(const IoResult& result);

/// `strerror(error)` as a std::string.
std::string errno_string(int error);

/// Sends all `size` bytes, waiting for room until `deadline`.
IoResult send_all(int fd, const uint8_t* data, size_t size, SteadyClock::time_point deadline);

/// Receives exactly `size` bytes, waiting for them until `deadline`.
IoResult recv_all(int fd, uint8_t* data, size_t size, SteadyClock::time_point deadline);

/// Outcome of one connection attempt.
struct ConnectResult {
  /// The connected socket (non-blocking, TCP_NODELAY), or invalid.
  Socket socket;
  /// Why it failed: the errno of the last address tried, or a resolver error.
  std::string error;
  /// Whether every address refused the connection (nothing listens there).
  bool refused = false;
};

/// Tries once to connect to every address `host` resolves to, in turn,
/// waiting until `deadline` at most. `host` may be a name, an IPv4 address or
/// an IPv6 address (with or without brackets).
ConnectResult try_connect(const std::string& host, int port, SteadyClock::time_point deadline);

/// A socket listening on every interface at `port` (0 picks a free port):
/// IPv6 accepting IPv4 too where the host has IPv6, else IPv4. Sets
/// SO_REUSEADDR. Throws IoError when it cannot listen. `bound_port` receives
/// the real port.
Socket listen_on(int port, int* bound_port);

/// Sets O_NONBLOCK and TCP_NODELAY on an accepted socket.
void configure_accepted(int fd);

/// "127.0.0.1:41234" or "[::1]:41234": the peer of a connected socket.
std::string peer_address(int fd);

/// "host:port", with brackets around an IPv6 address.
std::string host_port(const std::string& host, int port);

} // namespace ddp::internal
