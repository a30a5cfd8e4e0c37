#pragma once

// An owned POSIX file descriptor, closed on destruction.

#include <unistd.h>

#include <utility>

namespace ddp::launch {

/// Owns one file descriptor (or none: -1). Move-only.
/// Thread-safety: none; a UniqueFd belongs to one thread at a time.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset(std::exchange(other.fd_, -1));
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  /// The descriptor, still owned; -1 when empty.
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  /// Closes the descriptor held, if any, and takes `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) {
      // close() may fail with EINTR, but on Linux the descriptor is released
      // anyway, and retrying could close a descriptor another call reopened.
      ::close(fd_);
    }
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

} // namespace ddp::launch
