// Definitions for the private helpers in check.h, env.h and logging.h.

#include "internal/check.h"

#include <ddp/comm/error.h>
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

// Note [Start-up exit points]: DDP_TEST_INIT_EXIT_AT=<point>:<rank> makes
// that rank leave the process with _Exit(86), as a crashed or killed rank
// would leave it (no destructor, no goodbye on its sockets beyond the
// kernel's closing them), when it reaches <point> of init_process_group:
// store (the store connected, or served on rank 0), arrived (every rank has
// arrived in the Gloo rendezvous), gloo-connected (Gloo's pairs
// connected), addresses (the peer addresses exchanged), group (the group
// created, before the rendezvous's last store write). The start-up sweep
// (tests/comm/init_exit_sweep.sh) stops one rank at each and checks that
// every other rank gets a catchable error naming its rank, in time.
void init_exit_point(const char* point, int rank) {
  static const std::optional<std::string> chosen = env_get(kEnvTestInitExitAt);
  if (chosen && *chosen == std::string(point) + ":" + std::to_string(rank)) {
    std::fflush(nullptr);
    std::_Exit(86);
  }
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

namespace ddp {

std::string error_message(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    const auto backtrace = internal::env_get(internal::kEnvBacktrace);
    if (!backtrace || *backtrace != "1") {
      return c10_error->what_without_backtrace();
    }
  }
  return error.what();
}

} // namespace ddp
