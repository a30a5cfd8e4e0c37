#include "internal/text_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <thread>

namespace ddp::internal {

namespace {

// The length of the valid UTF-8 sequence at text[at] (a byte of 0x80 or
// more), or 0 when it is not one (a lone continuation byte, an overlong
// form, a surrogate, past U+10FFFF, cut short).
size_t utf8_sequence(const std::string& text, size_t at) {
  const auto byte = [&](size_t i) { return i < text.size() ? static_cast<unsigned char>(text[i]) : 0u; };
  const unsigned lead = byte(at);
  size_t length = 0;
  unsigned low = 0x80, high = 0xBF; // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    low = lead == 0xE0 ? 0xA0 : 0x80;
    high = lead == 0xED ? 0x9F : 0xBF;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    low = lead == 0xF0 ? 0x90 : 0x80;
    high = lead == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  if (byte(at + 1) < low || byte(at + 1) > high) {
    return 0;
  }
  for (size_t i = 2; i < length; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xBF) {
      return 0;
    }
  }
  return length;
}

} // namespace

void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (size_t at = 0; at < text.size(); ++at) {
    const auto c = static_cast<unsigned char>(text[at]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else if (const size_t length = utf8_sequence(text, at); length > 0) {
          out.append(text, at, length);
          at += length - 1;
        } else {
          // JSON is UTF-8: a byte that is not (a message cut inside a
          // character, Latin-1 from a system library) becomes U+FFFD, so
          // that every reader can read the file.
          out += "\\ufffd";
        }
    }
  }
  out += '"';
}

std::string make_directories(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at == path.size() || path[at] == '/') {
      const std::string part = path.substr(0, at);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        return "cannot create " + part + ": " + std::strerror(errno);
      }
    }
  }
  return "";
}

std::string replace_file(const std::string& path, const std::string& text) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (std::string problem = make_directories(path.substr(0, slash)); !problem.empty()) {
      return problem;
    }
  }
  // Unique per thread: two threads of one process may write the same file.
  const std::string aside = path + "." + std::to_string(::getpid()) + "." +
      std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + ".tmp";
  FILE* file = std::fopen(aside.c_str(), "w");
  if (file == nullptr) {
    return "cannot open " + aside + ": " + std::strerror(errno);
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(file) == 0;
  std::string problem;
  if (!written || !closed) {
    problem = "cannot write " + aside + ": " + std::strerror(written ? errno : write_errno);
  } else if (std::rename(aside.c_str(), path.c_str()) != 0) {
    problem = "cannot rename " + aside + " to " + path + ": " + std::strerror(errno);
  }
  if (!problem.empty()) {
    std::remove(aside.c_str());
  }
  return problem;
}

std::string read_bounded_file(const std::string& path, size_t max_bytes) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw std::runtime_error("cannot open it");
  }
  std::string text;
  char buffer[65536];
  while (file.read(buffer, sizeof(buffer)) || file.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(file.gcount()));
    if (text.size() > max_bytes) {
      throw std::runtime_error("larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  return text;
}

} // namespace ddp::internal
