#pragma once

// How ddprun relays its ranks' output: each child's stream is cut into lines
// (LineSplitter), and whole lines are written to ddprun's own stdout or stderr
// (OutputSink), so that lines of different ranks never interleave mid-line.

#include <cstddef>
#include <string>
#include <string_view>

namespace ddp::launch {

/// A line longer than this is passed on in pieces of this size rather than
/// held in memory until its newline comes (a child printing a progress bar
/// with '\r' and no '\n', for instance).
inline constexpr size_t kMaxLineBytes = 1 << 20;

/// Cuts one child's byte stream into lines and puts `prefix` in front of each.
/// With an empty prefix the bytes come out unchanged, only regrouped into
/// whole lines.
/// Thread-safety: none; one splitter per stream, used by ddprun's one thread.
class LineSplitter {
 public:
  explicit LineSplitter(std::string prefix = "", size_t max_line_bytes = kMaxLineBytes);

  /// Takes bytes read from the child. Returns the lines they complete, each
  /// prefixed and ended by its '\n'; keeps an unfinished last line for later.
  std::string feed(std::string_view bytes);

  /// At end of stream: the unfinished last line, prefixed, plus a '\n' when
  /// there is a prefix (so that the next rank's prefix starts a line); empty
  /// when the stream ended with '\n'.
  std::string finish();

 private:
  // Appends prefix_ + line to `out`, and a '\n' when `newline`.
  void emit(std::string& out, std::string_view line, bool newline) const;

  std::string prefix_;
  size_t max_line_bytes_;
  std::string partial_; // bytes after the last '\n' seen
};

/// One of ddprun's own output descriptors (1 or 2), written whole buffers at a
/// time. When the reader goes away (EPIPE), further output is dropped rather
/// than stopping the ranks: ddprun keeps draining their pipes so that no rank
/// blocks on a full pipe.
/// Thread-safety: none; used by ddprun's one thread.
class OutputSink {
 public:
  explicit OutputSink(int fd) : fd_(fd) {}

  /// Writes all of `bytes`, retrying short writes, EINTR and EAGAIN.
  void write(std::string_view bytes);

 private:
  int fd_;
  bool broken_ = false;
};

} // namespace ddp::launch
