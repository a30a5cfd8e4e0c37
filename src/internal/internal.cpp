// Definitions for the private helpers in check.h, env.h and logging.h.

#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ddp::internal {

void throw_check_error(
    const char* function,
    const char* file,
    uint32_t line,
    const std::string& message) {
  throw c10::Error(c10::SourceLocation{function, file, line}, message);
}

std::optional<std::string> env_get(const EnvVar& var) {
  const char* value = std::getenv(var.name);
  if (value != nullptr) {
    return std::string(value);
  }
  if (var.default_value != nullptr) {
    return std::string(var.default_value);
  }
  return std::nullopt;
}

namespace {
std::mutex& log_mutex() {
  static std::mutex mutex;
  return mutex;
}

void log_line(const char* level, const std::string& message) {
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(stderr, "[ddp %s] %s\n", level, message.c_str());
  std::fflush(stderr);
}
} // namespace

void log_warning(const std::string& message) {
  log_line("warning", message);
}

void log_info(const std::string& message) {
  log_line("info", message);
}

} // namespace ddp::internal
