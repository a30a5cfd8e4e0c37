#include "snapshots.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace gpt {
namespace {

const char* const kLatest = "latest";

std::runtime_error file_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": " + what);
}

// Files and directories through POSIX, not std::filesystem: PyPI's LibTorch
// 2.11 (libtorch.so) exports a copy of std::filesystem's functions, which
// then stand in for the C++ library's in this program, and its remove_all
// crashed (a call through a null pointer, at the first old snapshot
// removed). POSIX runs the same against every LibTorch.
bool path_exists(const std::string& path) {
  struct stat status {};
  return ::stat(path.c_str(), &status) == 0;
}

int remove_entry(const char* path, const struct stat* /*status*/, int /*type*/, struct FTW* /*where*/) {
  return ::remove(path);
}

} // namespace

std::string snapshot_name(int64_t completed_steps) {
  return "step-" + std::to_string(completed_steps);
}

int64_t read_latest(const std::string& dir) {
  const std::string path = dir + "/" + kLatest;
  if (!path_exists(path)) {
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
  if (!path_exists(dir + "/" + name + "/.metadata")) {
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
  std::vector<std::string> doomed;
  if (DIR* listing = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name.rfind("step-", 0) == 0 && name != kept) {
        doomed.push_back(dir + "/" + name);
      }
    }
    ::closedir(listing);
  }
  for (const auto& path : doomed) {
    // Depth first, not following links; a failure leaves the rest for the
    // next save to remove.
    ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  return static_cast<int>(doomed.size());
}

void make_directory(const std::string& dir) {
  // mkdir -p: each prefix that ends before a '/', then the whole path.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = dir.substr(0, end);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      throw std::runtime_error("--checkpoint-dir " + dir + ": cannot create " + prefix + ": " +
                               std::strerror(errno));
    }
    if (end == std::string::npos) {
      break;
    }
  }
  struct stat status {};
  if (::stat(dir.c_str(), &status) != 0 || !S_ISDIR(status.st_mode)) {
    throw std::runtime_error("--checkpoint-dir " + dir + ": cannot create it: it exists and is not a directory");
  }
}

} // namespace gpt
