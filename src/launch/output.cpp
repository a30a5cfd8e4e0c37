#include "launch/output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace ddp::launch {

LineSplitter::LineSplitter(std::string prefix, size_t max_line_bytes)
    : prefix_(std::move(prefix)), max_line_bytes_(max_line_bytes > 0 ? max_line_bytes : 1) {}

void LineSplitter::emit(std::string& out, std::string_view line, bool newline) const {
  out += prefix_;
  out += line;
  if (newline) {
    out += '\n';
  }
}

std::string LineSplitter::feed(std::string_view bytes) {
  std::string out;
  size_t start = 0;
  for (size_t newline = bytes.find('\n'); newline != std::string_view::npos;
       newline = bytes.find('\n', start)) {
    std::string_view tail = bytes.substr(start, newline - start);
    if (partial_.empty()) {
      emit(out, tail, true);
    } else {
      partial_ += tail;
      emit(out, partial_, true);
      partial_.clear();
    }
    start = newline + 1;
  }
  partial_ += bytes.substr(start);
  // An overlong line goes out in pieces; with a prefix each piece is made a
  // line of its own, so that every line of ddprun's output starts with one.
  while (partial_.size() >= max_line_bytes_) {
    emit(out, std::string_view(partial_).substr(0, max_line_bytes_), !prefix_.empty());
    partial_.erase(0, max_line_bytes_);
  }
  return out;
}

std::string LineSplitter::finish() {
  std::string out;
  if (!partial_.empty()) {
    emit(out, partial_, !prefix_.empty());
    partial_.clear();
  }
  return out;
}

void OutputSink::write(std::string_view bytes) {
  while (!bytes.empty() && !broken_) {
    ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n >= 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Our stdout was handed to us non-blocking (it is shared with whoever
      // started ddprun); wait until it drains.
      pollfd pfd{fd_, POLLOUT, 0};
      ::poll(&pfd, 1, -1);
    } else if (errno != EINTR) {
      broken_ = true; // EPIPE and friends: nobody reads this any more.
    }
  }
}

} // namespace ddp::launch
