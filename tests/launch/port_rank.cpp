// A rank for ddprun's restart tests: rank 0 listens on MASTER_PORT, as the
// rank that serves ddp's store does, and every other rank connects to it. In
// the attempts before FAIL_ATTEMPTS (DDP_RESTART_COUNT < FAIL_ATTEMPTS) rank
// 1 then exits 1, while rank 0 and a child it forked keep the port, ignoring
// SIGTERM, until ddprun kills them; in later attempts every rank exits 0.
// A restart that started before the old attempt let go of the port would
// make rank 0 fail to bind it.
//
// Usage: ddprun --max-restarts 1 --grace-period 0.5 ddprun_test_port_rank FAIL_ATTEMPTS
// Each rank prints one line per attempt, e.g.
//   attempt 0: rank 0 listening on port 29500
//   attempt 0: rank 1 connected to port 29500
// and "cannot bind ..." / "cannot connect ..." (exit 3) when it cannot.

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : -1;
}

addrinfo* resolve(const char* host, const char* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  return ::getaddrinfo(host, port, &hints, &found) == 0 ? found : nullptr;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ddprun_test_port_rank FAIL_ATTEMPTS\n");
    return 2;
  }
  const int fail_attempts = std::atoi(argv[1]);
  const int rank = env_int("RANK");
  const int attempt = env_int("DDP_RESTART_COUNT");
  const char* host = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (rank < 0 || attempt < 0 || host == nullptr || port == nullptr) {
    std::fprintf(stderr, "ddprun_test_port_rank: RANK, DDP_RESTART_COUNT, MASTER_ADDR or "
                         "MASTER_PORT is not set\n");
    return 2;
  }
  const bool failing = attempt < fail_attempts;
  addrinfo* address = resolve(host, port);
  if (address == nullptr) {
    std::printf("attempt %d: rank %d cannot resolve %s\n", attempt, rank, host);
    return 3;
  }
  if (rank == 0) {
    const int fd = ::socket(address->ai_family, address->ai_socktype, address->ai_protocol);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); // as ddp's store does
    if (::bind(fd, address->ai_addr, address->ai_addrlen) != 0 || ::listen(fd, 8) != 0) {
      std::printf("attempt %d: rank 0 cannot bind port %s: %s\n", attempt, port,
                  std::strerror(errno));
      return 3;
    }
    std::printf("attempt %d: rank 0 listening on port %s\n", attempt, port);
    std::fflush(stdout);
    pollfd waiting{fd, POLLIN, 0};
    if (::poll(&waiting, 1, 20000) != 1) {
      std::printf("attempt %d: rank 0 got no connection\n", attempt);
      return 3;
    }
    const int peer = ::accept(fd, nullptr, nullptr);
    if (!failing) {
      char byte;
      while (::read(peer, &byte, 1) > 0) { // until rank 1 closes
      }
      return 0;
    }
    // Hold the port, as a store whose rank hangs would, with a child that
    // holds it too: ddprun must wait for both to be gone.
    ::signal(SIGTERM, SIG_IGN);
    ::fork();
    ::sleep(60);
    return 0;
  }

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int fd = -1;
  while (true) {
    // A socket whose connect failed cannot be used again: a new one each try.
    fd = ::socket(address->ai_family, address->ai_socktype, address->ai_protocol);
    if (::connect(fd, address->ai_addr, address->ai_addrlen) == 0) {
      break;
    }
    const int error = errno;
    ::close(fd);
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("attempt %d: rank %d cannot connect to port %s: %s\n", attempt, rank, port,
                  std::strerror(error));
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("attempt %d: rank %d connected to port %s\n", attempt, rank, port);
  std::fflush(stdout);
  if (failing && rank == 1) {
    std::fprintf(stderr, "attempt %d: rank 1 fails\n", attempt);
    return 1;
  }
  if (failing) {
    ::sleep(60); // stopped by ddprun
  }
  ::close(fd);
  return 0;
}
