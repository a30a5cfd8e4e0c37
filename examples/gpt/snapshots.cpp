#include "snapshots.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace gpt {
namespace {

const char* const kLatest = "latest";

std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

} // namespace

std::string snapshot_name(int64_t completed_steps) {
  return "step-" + std::to_string(completed_steps);
}

int64_t read_latest(const std::string& dir) {
  const std::string path = dir + "/" + kLatest;
  std::error_code missing;
  if (!std::filesystem::exists(path, missing)) {
    return -1;
  }
  std::ifstream in(path);
  if (!in) {
    throw file_error(path, std::string("cannot read it: ") + std::strerror(errno));
  }
  std::string line, name;
  int64_t steps = -1;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "checkpoint") {
      words >> name;
    } else if (key == "completed_steps") {
      if (!(words >> steps) || steps < 0) {
        throw file_error(path, "'completed_steps' is not a count of steps: '" + line + "'");
      }
    }
  }
  if (steps < 0 || name != snapshot_name(steps)) {
    throw file_error(path, "expected the lines 'checkpoint step-S' and 'completed_steps S' (gpt_train writes them), "
                           "found checkpoint '" + name + "' and completed_steps " + std::to_string(steps));
  }
  if (!std::filesystem::exists(dir + "/" + name + "/.metadata")) {
    throw file_error(path, "names " + name + ", but " + dir + "/" + name +
                               "/.metadata is missing (the directory was removed or changed by hand?)");
  }
  return steps;
}

void write_latest(const std::string& dir, int64_t completed_steps) {
  const std::string path = dir + "/" + kLatest;
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << "checkpoint " << snapshot_name(completed_steps) << "\n"
        << "completed_steps " << completed_steps << "\n";
    out.flush();
    if (!out) {
      throw file_error(temporary, std::string("cannot write it: ") + std::strerror(errno));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    throw file_error(path, "cannot rename " + temporary + " over it: " + std::strerror(errno));
  }
}

int remove_other_snapshots(const std::string& dir, int64_t keep) {
  const std::string kept = snapshot_name(keep);
  int removed = 0;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name != kept) {
      std::filesystem::remove_all(entry.path(), ignored);
      ++removed;
    }
  }
  return removed;
}

void make_directory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw std::runtime_error("--checkpoint-dir " + dir + ": cannot create it: " + error.message());
  }
}

} // namespace gpt
