#pragma once

// The launcher's account of a failed job (private header; no Torch, so that
// ddprun shares it): which rank ddprun saw fail first, written beside the
// ranks' flight recorder dumps as launcher.json, and read by
// `ddprun --analyze`. See Note [Launcher's account] in launcher_account.cpp.

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::flight_recorder {

struct LauncherAccount {
  std::string job;         // job_name() of the job
  int world_size = 0;
  int attempt = 0;         // ddprun's restart count when it failed
  int first_failed = -1;   // the global rank that failed first
  std::string what;        // "was killed by signal 9 (SIGKILL)"
  int64_t at_us = 0;       // when ddprun saw it (microseconds since the epoch)
};

constexpr const char* kLauncherAccountFile = "launcher.json";

// Writes `account` to `dir`/launcher.json (the directory created when
// missing, the file through a rename). Returns false, and says why in
// `error`, when it cannot.
bool write_launcher_account(const std::string& dir, const LauncherAccount& account, std::string* error);

// The account in `dir`, or nullopt when there is none; throws
// std::runtime_error naming the file when it is there but unreadable.
std::optional<LauncherAccount> read_launcher_account(const std::string& dir);

} // namespace ddp::flight_recorder
