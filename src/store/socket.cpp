// POSIX socket helpers of the TCPStore; see socket.h.

#include "store/socket.h"

#include <ddp/comm/error.h>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ddp::internal {

namespace {

// Milliseconds from now to `deadline`, rounded up, for poll(); 0 if past.
int poll_timeout_ms(SteadyClock::time_point deadline) {
  const auto left = deadline - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) {
    return 0;
  }
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 60 * 60 * 1000));
}

// Waits until `fd` is ready for `events`; false when the deadline passed.
// Errors and hang-ups count as ready: the next call reports them.
bool wait_ready(int fd, short events, SteadyClock::time_point deadline, IoResult& failure) {
  while (true) {
    pollfd p{fd, events, 0};
    const int timeout_ms = poll_timeout_ms(deadline);
    const int n = ::poll(&p, 1, timeout_ms);
    if (n > 0) {
      return true;
    }
    if (n < 0 && errno != EINTR) {
      failure = IoResult{IoStatus::kFailed, errno};
      return false;
    }
    if (n == 0 && timeout_ms == 0) {
      failure = IoResult{IoStatus::kTimedOut, 0};
      return false;
    }
  }
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

} // namespace

Socket::~Socket() {
  reset();
}

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::reset() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

std::string errno_string(int error) {
  char buffer[256];
  // The GNU strerror_r returns the message, possibly not in `buffer`.
  return std::string(::strerror_r(error, buffer, sizeof(buffer)));
}

std::string describe(const IoResult& result) {
  switch (result.status) {
    case IoStatus::kOk:
      return "ok";
    case IoStatus::kTimedOut:
      return "timed out";
    case IoStatus::kClosed:
      return "the peer closed the connection";
    case IoStatus::kFailed:
      return errno_string(result.error);
  }
  return "unknown";
}

IoResult send_all(int fd, const uint8_t* data, size_t size, SteadyClock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoResult failure;
      if (!wait_ready(fd, POLLOUT, deadline, failure)) {
        return failure;
      }
      continue;
    }
    return IoResult{IoStatus::kFailed, n < 0 ? errno : EIO};
  }
  return IoResult{};
}

IoResult recv_all(int fd, uint8_t* data, size_t size, SteadyClock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return IoResult{IoStatus::kClosed, 0};
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult failure;
      if (!wait_ready(fd, POLLIN, deadline, failure)) {
        return failure;
      }
      continue;
    }
    return IoResult{IoStatus::kFailed, errno};
  }
  return IoResult{};
}

ConnectResult try_connect(const std::string& host, int port, SteadyClock::time_point deadline) {
  ConnectResult result;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  const std::string service = std::to_string(port);
  // getaddrinfo has no deadline of its own; the resolver's timeouts bound it.
  const int rc = ::getaddrinfo(strip_brackets(host).c_str(), service.c_str(), &hints, &raw);
  if (rc != 0) {
    result.error = std::string("cannot resolve '") + host + "': " + ::gai_strerror(rc);
    return result;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(raw, ::freeaddrinfo);

  bool all_refused = true;
  for (const addrinfo* ai = addresses.get(); ai != nullptr; ai = ai->ai_next) {
    Socket socket(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!socket.valid()) {
      result.error = "socket(): " + errno_string(errno);
      all_refused = false;
      continue;
    }
    int error = 0;
    if (::connect(socket.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        IoResult failure;
        if (!wait_ready(socket.fd(), POLLOUT, deadline, failure)) {
          result.error = "connect(): " + describe(failure);
          all_refused = false;
          continue;
        }
        socklen_t len = sizeof(error);
        if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
          error = errno;
        }
      }
    }
    if (error != 0) {
      result.error = "connect(): " + errno_string(error);
      all_refused = all_refused && error == ECONNREFUSED;
      continue;
    }
    set_nodelay(socket.fd());
    result.socket = std::move(socket);
    result.error.clear();
    return result;
  }
  if (result.error.empty()) {
    result.error = "'" + host + "' resolved to no address";
    all_refused = false;
  }
  result.refused = all_refused;
  return result;
}

Socket listen_on(int port, int* bound_port) {
  auto fail = [&](const char* what, int error) {
    return IoError(
        "TCPStore server: cannot listen on port " + std::to_string(port) +
        ": " + what + ": " + errno_string(error));
  };
  Socket socket(::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  bool ipv6 = socket.valid();
  if (!ipv6) {
    socket = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!socket.valid()) {
      throw fail("socket()", errno);
    }
  }
  int one = 1;
  if (::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    throw fail("SO_REUSEADDR", errno);
  }
  int bind_rc = -1;
  if (ipv6) {
    int zero = 0; // Dual stack: IPv4 clients arrive as ::ffff:a.b.c.d.
    ::setsockopt(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(port));
    bind_rc = ::bind(socket.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
    if (bind_rc != 0 && errno == EADDRNOTAVAIL) {
      // IPv6 sockets exist but the host has no IPv6 address: use IPv4.
      socket = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!socket.valid()) {
        throw fail("socket()", errno);
      }
      ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      ipv6 = false;
    }
  }
  if (!ipv6) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    bind_rc = ::bind(socket.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  }
  if (bind_rc != 0) {
    throw fail("bind()", errno);
  }
  if (::listen(socket.fd(), SOMAXCONN) != 0) {
    throw fail("listen()", errno);
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    throw fail("getsockname()", errno);
  }
  *bound_port = bound.ss_family == AF_INET6
      ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return socket;
}

void configure_accepted(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) {
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }
  set_nodelay(fd);
}

std::string peer_address(int fd) {
  sockaddr_storage address{};
  socklen_t len = sizeof(address);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) {
    return "<unknown peer>";
  }
  char text[INET6_ADDRSTRLEN] = {0};
  if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return host_port(text, ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
  ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  return host_port(text, ntohs(a->sin_port));
}

std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return "[" + host + "]:" + std::to_string(port);
  }
  return host + ":" + std::to_string(port);
}

} // namespace ddp::internal
