// Files that survive a crash; see checkpoint_files.h.

#include "nn/checkpoint_files.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "internal/env.h"

namespace ddp::internal {

namespace {
constexpr size_t kReadChunkBytes = 1 << 20;
} // namespace

std::string errno_text(int error) {
  return std::strerror(error);
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_name_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool all_of_chars(const std::string& text, size_t from, const char* allowed) {
  return from < text.size() && text.find_first_not_of(allowed, from) == std::string::npos;
}

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return; // some file systems cannot open a directory; the rename stands
  }
  ::fsync(fd);
  ::close(fd);
}

void rename_file(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw std::runtime_error(
        c10::str("cannot rename '", from, "' to '", to, "': ", errno_text(errno)));
  }
}

std::optional<Checksum> checksum_of_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return std::nullopt;
    }
    throw std::runtime_error(c10::str("cannot open '", path, "': ", errno_text(errno)));
  }
  Checksum checksum;
  std::vector<char> buffer(kReadChunkBytes);
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      throw std::runtime_error(c10::str("cannot read '", path, "': ", errno_text(error)));
    }
    if (n == 0) {
      break;
    }
    checksum.feed(buffer.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return checksum;
}

void crash_point(const char* point, const NewFile* half_written) {
  const auto chosen = env_get(kEnvTestCheckpointCrashAt);
  if (!chosen || *chosen != point) {
    return;
  }
  if (half_written != nullptr) {
    ::ftruncate(half_written->fd(), static_cast<off_t>(half_written->checksum().size() / 2));
  }
  ::kill(::getpid(), SIGKILL);
  ::pause();
}

std::string new_save_id() {
  std::random_device device;
  const uint64_t random = (static_cast<uint64_t>(device()) << 32) ^ device();
  const auto now = static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch().count());
  Checksum mix;
  const uint64_t parts[] = {random, now, static_cast<uint64_t>(::getpid())};
  mix.feed(parts, sizeof parts);
  return hex64(mix.value());
}

} // namespace ddp::internal
