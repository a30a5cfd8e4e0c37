// Note [Launcher's account]
// The ranks' dumps say where each rank was, but not always who failed
// first: a rank killed outright leaves no dump, which points at it, but a
// rank that failed on its own and dumped, or one that was stopped (SIGSTOP)
// and then dumped when ddprun continued it, looks like any other. ddprun
// knows: the first rank whose process ends badly is the one it reports and
// stops the job for. When that happens it writes launcher.json into the
// job's dump folder (before asking the others for their dumps), and
// `ddprun --analyze` puts that rank first in the default group's verdict.
// The ranks' own errors carry the group's record of its first failure too
// (Note [First failure] in src/comm/failure_ledger.cpp), which is what the
// analyzer uses without ddprun (torchrun, mpirun, Slurm).
//
// {"schema": "ddp-launcher-account", "version": 1, "job": "...",
//  "world_size": 4, "attempt": 0, "first_failed": 3,
//  "what": "was killed by signal 9 (SIGKILL)", "at_us": 1795...}

#include "launch/readers/launcher_account.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "internal/json.h"
#include "internal/text_files.h"

namespace ddp::flight_recorder {

namespace {

constexpr size_t kMaxAccountBytes = 1 << 16;

bool make_directories(const std::string& dir, std::string* error) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      *error = "cannot create " + prefix + ": " + std::strerror(errno);
      return false;
    }
    if (slash == std::string::npos) {
      return true;
    }
  }
}

} // namespace

bool write_launcher_account(const std::string& dir, const LauncherAccount& account, std::string* error) {
  if (!make_directories(dir, error)) {
    return false;
  }
  json::Value root;
  root.kind = json::Value::Kind::kObject;
  root.members["schema"] = json::string_value("ddp-launcher-account");
  root.members["version"] = json::number_value(1);
  root.members["job"] = json::string_value(account.job);
  root.members["world_size"] = json::number_value(account.world_size);
  root.members["attempt"] = json::number_value(account.attempt);
  root.members["first_failed"] = json::number_value(account.first_failed);
  root.members["what"] = json::string_value(account.what);
  root.members["at_us"] = json::number_value(static_cast<double>(account.at_us));
  std::string body;
  json::write(root, body);
  body += "\n";
  const std::string path = dir + "/" + kLauncherAccountFile;
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << body;
    out.close();
    if (!out) {
      *error = "cannot write " + temporary;
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + temporary + " to " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

std::optional<LauncherAccount> read_launcher_account(const std::string& dir) {
  const std::string path = dir + "/" + kLauncherAccountFile;
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return std::nullopt;
  }
  const json::Value root = json::parse(internal::read_bounded_file(path, kMaxAccountBytes));
  if (!root.is(json::Value::Kind::kObject) || root.string_or("schema", "") != "ddp-launcher-account" ||
      root.int_or("version", 0) != 1) {
    throw std::runtime_error(path + ": not a version-1 ddp launcher account");
  }
  LauncherAccount account;
  account.job = root.string_or("job", "");
  account.world_size = static_cast<int>(root.int_or("world_size", 0));
  account.attempt = static_cast<int>(root.int_or("attempt", 0));
  account.first_failed = static_cast<int>(root.int_or("first_failed", -1));
  account.what = root.string_or("what", "");
  account.at_us = root.int_or("at_us", 0);
  if (account.first_failed < 0) {
    throw std::runtime_error(path + ": no \"first_failed\" rank");
  }
  return account;
}

} // namespace ddp::flight_recorder
