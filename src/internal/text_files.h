#pragma once

// Writing the small text files that ddp leaves for a user to read (private
// header): the flight recorder's dumps, the timeline's traces and ddprun's
// merged trace. Plain C++17 and POSIX, no Torch, so that ddprun shares it.

#include <cstddef>
#include <string>

namespace ddp::internal {

// Appends `text` to `out` as a JSON string literal, quotes included; bytes
// that are not UTF-8 become U+FFFD (JSON text is UTF-8).
void append_json_string(std::string& out, const std::string& text);

// Creates the directory `path` and its missing parents (mkdir -p). Returns ""
// or what failed ("cannot create /x: Permission denied").
std::string make_directories(const std::string& path);

// Writes `text` to `path` atomically: to a file beside it, then renamed
// over it, so that a reader finds the old file or the new one, never half of
// one. Creates the directory. Returns "" or what failed.
std::string replace_file(const std::string& path, const std::string& text);

// The whole of the file at `path`, at most `max_bytes` of it. Throws
// std::runtime_error saying "cannot open it" or "larger than N bytes" (the
// caller names the file).
std::string read_bounded_file(const std::string& path, size_t max_bytes);

} // namespace ddp::internal
