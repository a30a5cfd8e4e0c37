#pragma once

// Files that survive a crash: what DistributedDataParallel's checkpoints
// (src/nn/checkpoint.cpp) and FullyShardedDataParallel's sharded ones
// (src/fsdp/sharded_checkpoint.cpp) write through (private header). A file
// is written under a temporary name with write(2), its checksum kept as it
// goes, fsync'ed, and renamed into place; the directory is fsync'ed after
// the rename.

#include <torch/serialize/output-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <c10/util/StringUtil.h>

#include "internal/hash.h"

namespace ddp::internal {

std::string errno_text(int error);

// The directory part of `path` ("." when it has none), and the rest.
std::string directory_of(const std::string& path);
std::string base_name_of(const std::string& path);

// True when text[from..] is not empty and holds only `allowed` characters.
bool all_of_chars(const std::string& text, size_t from, const char* allowed);

// Checksum: internal/hash.h.

// `value` as 16 hexadecimal digits.
std::string hex64(uint64_t value);

// A file being written with write(2), so that it can be fsync'ed before it
// is renamed into place; it keeps the checksum of what was written.
// Thread-safety: none; used by rank 0's calling thread.
class NewFile {
 public:
  // Whether to keep the checksum of what is written (a pass over every
  // byte): the files a manifest names need it, DCP's chunk files do not.
  enum class Checksummed { kYes, kNo };

  explicit NewFile(std::string path, Checksummed checksummed = Checksummed::kYes)
      : path_(std::move(path)), checksummed_(checksummed == Checksummed::kYes) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      throw std::runtime_error(c10::str("cannot create '", path_, "': ", errno_text(errno)));
    }
  }

  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;

  ~NewFile() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }

  // The writer function of OutputArchive::save_to: returns `size` when all
  // was written, less on an error (the archive then fails; finish() names
  // the error). Never throws, since it is called from inside the zip writer.
  size_t write(const void* data, size_t size) noexcept {
    const auto* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size && error_ == 0) {
      const ssize_t n = ::write(fd_, bytes + done, size - done);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        error_ = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (checksummed_) {
      checksum_.feed(data, done);
    }
    return done;
  }

  // Writes `archive` to the file.
  void save(torch::serialize::OutputArchive& archive) {
    try {
      archive.save_to([this](const void* data, size_t size) { return write(data, size); });
    } catch (const std::exception& e) {
      if (error_ == 0) {
        throw;
      }
      // The archive's own message says only that a write failed.
    }
    if (error_ != 0) {
      throw std::runtime_error(c10::str("cannot write '", path_, "': ", errno_text(error_)));
    }
  }

  // Flushes the file to the disk and closes it: a file renamed into place
  // must be complete after a power cut too, not only after a crash.
  void finish() {
    if (::fsync(fd_) != 0) {
      throw std::runtime_error(c10::str("cannot fsync '", path_, "': ", errno_text(errno)));
    }
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      throw std::runtime_error(c10::str("cannot close '", path_, "': ", errno_text(errno)));
    }
  }

  int fd() const {
    return fd_;
  }

  const Checksum& checksum() const {
    return checksum_;
  }

 private:
  std::string path_;
  bool checksummed_;
  int fd_ = -1;
  int error_ = 0;
  Checksum checksum_;
};

// fsync of a directory, after a rename in it (best effort: some file
// systems cannot open a directory).
void sync_directory(const std::string& dir);

// rename(2), throwing std::runtime_error naming both paths.
void rename_file(const std::string& from, const std::string& to);

// Size and checksum of the file at `path`, or nullopt when it does not exist.
std::optional<Checksum> checksum_of_file(const std::string& path);

// Note [Checkpoint crash points]: DDP_TEST_CHECKPOINT_CRASH_AT=<point> makes
// the saving process kill itself with SIGKILL at that point of a save, as a
// killed job would die, so that tests can check what every point leaves.
// With `half_written` set, the file it names is first cut to half its size,
// as a crash in the middle of the write would leave it.
void crash_point(const char* point, const NewFile* half_written = nullptr);

// 16 hexadecimal digits, different for every save (random, time, pid).
std::string new_save_id();

} // namespace ddp::internal
