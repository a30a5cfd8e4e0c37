// FileStore: a key-value store in one file shared by the processes of a host.
//
// How it works
// ------------
// The file is a log. It opens with an 8-byte header, the magic "DDPFSTv1",
// followed by records appended one after the other:
//
//   set record:     'S' | u32 key_len | key bytes | u32 value_len | value bytes
//   delete record:  'D' | u32 key_len | key bytes
//
// (u32 little-endian). Replaying the records in order gives the map, so every
// FileStore keeps the map of the records it has read (`map_`) and how far it
// has read (`offset_`), and only ever reads what was appended since.
//
// Writers (set, add, compare_set, delete_key, and the header) hold an
// exclusive flock on the file while they read up to the end and append, which
// makes add and compare_set atomic across processes; readers hold a shared
// flock. Locks are taken with LOCK_NB and retried with backoff until the
// store's deadline, so no call blocks forever on a process that hangs while
// holding the lock. A writer that died in the middle of an append leaves a
// torn last record: readers stop before it and the next writer cuts it off
// before appending.
//
// `get` and `wait` poll: they look at the file size (fstat, no lock), read the
// new records when it grew, and sleep from 1 ms doubling up to 50 ms between
// looks until the deadline.

#include <ddp/store/file_store.h>

#include <ddp/comm/error.h>

#include "store/store_util.h"
#include "internal/check.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[] = "DDPFSTv1";
constexpr int64_t kHeaderBytes = 8;
constexpr uint8_t kSetRecord = 'S';
constexpr uint8_t kDeleteRecord = 'D';
constexpr std::chrono::milliseconds kMaxPollInterval{50};

std::string errno_text(int error) {
  return std::string(std::strerror(error));
}

void put_u32(std::vector<uint8_t>& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) {
    out.push_back(static_cast<uint8_t>(value >> (8 * i)));
  }
}

uint32_t read_u32(const uint8_t* p) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= static_cast<uint32_t>(p[i]) << (8 * i);
  }
  return value;
}

void put_bytes(std::vector<uint8_t>& out, const uint8_t* data, size_t size) {
  put_u32(out, static_cast<uint32_t>(size));
  out.insert(out.end(), data, data + size);
}

void check_size(const char* op, const char* what, size_t size) {
  DDP_CHECK(
      size <= UINT32_MAX, "FileStore ", op, ": the ", what, " is ", size,
      " bytes, more than the limit of ", UINT32_MAX);
}

std::vector<uint8_t> set_record(
    const char* op,
    const std::string& key,
    const std::vector<uint8_t>& value) {
  check_size(op, "key", key.size());
  check_size(op, "value", value.size());
  std::vector<uint8_t> record;
  record.reserve(9 + key.size() + value.size());
  record.push_back(kSetRecord);
  put_bytes(record, reinterpret_cast<const uint8_t*>(key.data()), key.size());
  put_bytes(record, value.data(), value.size());
  return record;
}

std::vector<uint8_t> delete_record(const std::string& key) {
  check_size("delete_key", "key", key.size());
  std::vector<uint8_t> record;
  record.push_back(kDeleteRecord);
  put_bytes(record, reinterpret_cast<const uint8_t*>(key.data()), key.size());
  return record;
}

// Sleeps for `interval` (not past `deadline`) and doubles it up to `cap`.
void back_off(
    std::chrono::milliseconds& interval,
    Clock::time_point deadline,
    std::chrono::milliseconds cap) {
  const auto now = Clock::now();
  if (now < deadline) {
    std::this_thread::sleep_for(std::min<Clock::duration>(interval, deadline - now));
  }
  interval = std::min(interval * 2, cap);
}

} // namespace

// Holds an flock on the store file for one scope; taking it retries with
// backoff until a deadline. Thread-safety: used by one thread, under mutex_.
class FileStore::FileLock {
 public:
  FileLock(
      int fd,
      int mode,
      const char* op,
      const std::string& path,
      std::chrono::milliseconds timeout)
      : fd_(fd) {
    const auto deadline = internal::deadline_after(timeout);
    auto interval = std::chrono::milliseconds(1);
    while (true) {
      if (::flock(fd_, mode | LOCK_NB) == 0) {
        return;
      }
      const int error = errno;
      if (error == EINTR) {
        continue;
      }
      if (error != EWOULDBLOCK) {
        throw IoError(
            std::string("FileStore ") + op + ": cannot lock '" + path +
            "': " + errno_text(error));
      }
      if (Clock::now() >= deadline) {
        throw TimeoutError(
            std::string("FileStore ") + op + ": timed out after " +
            std::to_string(timeout.count()) + " ms waiting for the lock on '" +
            path + "' (another process holds it)");
      }
      back_off(interval, deadline, std::chrono::milliseconds(20));
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  const int fd_;
};

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout)
    : Store(timeout), path_(std::move(path)) {
  DDP_CHECK(!path_.empty(), "FileStore: the path is empty");
  std::lock_guard<std::mutex> guard(mutex_);
  ensure_open_locked();
  FileLock lock(fd_, LOCK_EX, "open", path_, this->timeout());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw IoError("FileStore: cannot stat '" + path_ + "': " + errno_text(errno));
  }
  if (st.st_size == 0) {
    append_locked("open", std::vector<uint8_t>(kMagic, kMagic + kHeaderBytes));
  }
  refresh_locked("open", /*truncate_torn_tail=*/true);
}

FileStore::~FileStore() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

const std::string& FileStore::path() const {
  return path_;
}

void FileStore::ensure_open_locked() {
  const pid_t pid = ::getpid();
  if (fd_ >= 0 && fd_pid_ == pid) {
    return;
  }
  if (fd_ >= 0) {
    ::close(fd_); // The parent's descriptor, inherited by fork.
    fd_ = -1;
  }
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw IoError("FileStore: cannot open '" + path_ + "': " + errno_text(errno));
  }
  fd_ = fd;
  fd_pid_ = pid;
}

void FileStore::refresh_locked(const char* op, bool truncate_torn_tail) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw IoError(
        std::string("FileStore ") + op + ": cannot stat '" + path_ + "': " +
        errno_text(errno));
  }
  const int64_t size = st.st_size;
  if (size < offset_) {
    throw IoError(
        std::string("FileStore ") + op + ": '" + path_ + "' shrank from " +
        std::to_string(offset_) + " to " + std::to_string(size) +
        " bytes; was it rewritten while in use?");
  }
  if (size == offset_) {
    return;
  }
  std::vector<uint8_t> data(static_cast<size_t>(size - offset_));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pread(
        fd_, data.data() + done, data.size() - done,
        static_cast<off_t>(offset_ + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      throw IoError(
          std::string("FileStore ") + op + ": cannot read '" + path_ + "': " +
          (n == 0 ? std::string("unexpected end of file") : errno_text(errno)));
    }
    done += static_cast<size_t>(n);
  }

  size_t pos = 0;
  auto corrupt = [&](const std::string& why) {
    return IoError(
        std::string("FileStore ") + op + ": '" + path_ +
        "' is not a FileStore file or is corrupt (" + why + " at byte " +
        std::to_string(offset_ + static_cast<int64_t>(pos)) + ")");
  };
  if (offset_ == 0) {
    if (data.size() < static_cast<size_t>(kHeaderBytes)) {
      // Only a writer that died while writing the header leaves this.
      if (std::memcmp(data.data(), kMagic, data.size()) != 0) {
        throw corrupt("bad header");
      }
      if (truncate_torn_tail) {
        if (::ftruncate(fd_, 0) != 0) {
          throw IoError("FileStore: cannot truncate '" + path_ + "': " + errno_text(errno));
        }
        append_locked(op, std::vector<uint8_t>(kMagic, kMagic + kHeaderBytes));
        offset_ = kHeaderBytes;
      }
      return;
    }
    if (std::memcmp(data.data(), kMagic, kHeaderBytes) != 0) {
      throw corrupt("bad header");
    }
    pos = kHeaderBytes;
  }

  // Returns false when fewer than `n` bytes remain (a torn record).
  auto has = [&](size_t at, size_t n) { return data.size() - at >= n; };
  while (pos < data.size()) {
    const uint8_t kind = data[pos];
    if (kind != kSetRecord && kind != kDeleteRecord) {
      throw corrupt("unknown record kind " + std::to_string(kind));
    }
    size_t at = pos + 1;
    if (!has(at, 4)) {
      break;
    }
    const size_t key_len = read_u32(&data[at]);
    at += 4;
    if (!has(at, key_len)) {
      break;
    }
    std::string key(reinterpret_cast<const char*>(&data[at]), key_len);
    at += key_len;
    if (kind == kSetRecord) {
      if (!has(at, 4)) {
        break;
      }
      const size_t value_len = read_u32(&data[at]);
      at += 4;
      if (!has(at, value_len)) {
        break;
      }
      map_[std::move(key)] = std::vector<uint8_t>(
          data.begin() + static_cast<std::ptrdiff_t>(at),
          data.begin() + static_cast<std::ptrdiff_t>(at + value_len));
      at += value_len;
    } else {
      map_.erase(key);
    }
    pos = at;
  }
  offset_ += static_cast<int64_t>(pos);
  if (pos < data.size() && truncate_torn_tail) {
    if (::ftruncate(fd_, static_cast<off_t>(offset_)) != 0) {
      throw IoError(
          std::string("FileStore ") + op + ": cannot cut the torn record off '" +
          path_ + "': " + errno_text(errno));
    }
  }
}

void FileStore::append_locked(const char* op, const std::vector<uint8_t>& record) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw IoError(
        std::string("FileStore ") + op + ": cannot stat '" + path_ + "': " +
        errno_text(errno));
  }
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::pwrite(
        fd_, record.data() + done, record.size() - done,
        static_cast<off_t>(st.st_size + static_cast<off_t>(done)));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      throw IoError(
          std::string("FileStore ") + op + ": cannot write '" + path_ + "': " +
          errno_text(n == 0 ? EIO : errno));
    }
    done += static_cast<size_t>(n);
  }
}

void FileStore::poll_locked(const char* op) {
  ensure_open_locked();
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw IoError(
        std::string("FileStore ") + op + ": cannot stat '" + path_ + "': " +
        errno_text(errno));
  }
  if (st.st_size == offset_) {
    return; // Nothing was appended since we last read.
  }
  FileLock lock(fd_, LOCK_SH, op, path_, timeout());
  refresh_locked(op, /*truncate_torn_tail=*/false);
}

void FileStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  const std::vector<uint8_t> record = set_record("set", key, value);
  std::lock_guard<std::mutex> guard(mutex_);
  ensure_open_locked();
  FileLock lock(fd_, LOCK_EX, "set", path_, timeout());
  refresh_locked("set", /*truncate_torn_tail=*/true);
  append_locked("set", record);
  refresh_locked("set", /*truncate_torn_tail=*/true);
}

std::vector<uint8_t> FileStore::get(const std::string& key) {
  std::vector<uint8_t> value;
  wait_for("get", {key}, timeout(), &value);
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(mutex_);
  ensure_open_locked();
  FileLock lock(fd_, LOCK_EX, "add", path_, timeout());
  refresh_locked("add", /*truncate_torn_tail=*/true);
  std::optional<std::vector<uint8_t>> current;
  auto it = map_.find(key);
  if (it != map_.end()) {
    current = it->second;
  }
  const int64_t result = internal::add_to_counter("FileStore add", key, current, delta);
  append_locked("add", set_record("add", key, internal::counter_bytes(result)));
  refresh_locked("add", /*truncate_torn_tail=*/true);
  return result;
}

std::vector<uint8_t> FileStore::compare_set(
    const std::string& key,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  std::lock_guard<std::mutex> guard(mutex_);
  ensure_open_locked();
  FileLock lock(fd_, LOCK_EX, "compare_set", path_, timeout());
  refresh_locked("compare_set", /*truncate_torn_tail=*/true);
  std::optional<std::vector<uint8_t>> current;
  auto it = map_.find(key);
  if (it != map_.end()) {
    current = it->second;
  }
  std::vector<uint8_t> result;
  auto next = internal::compare_set_outcome(current, expected, desired, result);
  if (next.has_value()) {
    append_locked("compare_set", set_record("compare_set", key, *next));
    refresh_locked("compare_set", /*truncate_torn_tail=*/true);
  }
  return result;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(mutex_);
  poll_locked("check");
  for (const auto& key : keys) {
    if (map_.count(key) == 0) {
      return false;
    }
  }
  return true;
}

void FileStore::wait(
    const std::vector<std::string>& keys,
    std::chrono::milliseconds timeout) {
  wait_for("wait", keys, timeout, nullptr);
}

bool FileStore::delete_key(const std::string& key) {
  const std::vector<uint8_t> record = delete_record(key);
  std::lock_guard<std::mutex> guard(mutex_);
  ensure_open_locked();
  FileLock lock(fd_, LOCK_EX, "delete_key", path_, timeout());
  refresh_locked("delete_key", /*truncate_torn_tail=*/true);
  if (map_.count(key) == 0) {
    return false;
  }
  append_locked("delete_key", record);
  refresh_locked("delete_key", /*truncate_torn_tail=*/true);
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> guard(mutex_);
  poll_locked("num_keys");
  return static_cast<int64_t>(map_.size());
}

void FileStore::wait_for(
    const char* op,
    const std::vector<std::string>& keys,
    std::chrono::milliseconds timeout,
    std::vector<uint8_t>* value) {
  DDP_CHECK(
      timeout.count() >= 0, "FileStore ", op,
      ": timeout must not be negative (got ", timeout.count(), " ms)");
  const auto deadline = internal::deadline_after(timeout);
  auto interval = std::chrono::milliseconds(1);
  std::vector<std::string> missing;
  while (true) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      poll_locked(op);
      missing.clear();
      for (const auto& key : keys) {
        if (map_.count(key) == 0) {
          missing.push_back(key);
        }
      }
      if (missing.empty() && value != nullptr) {
        // Copied under the lock: a later delete cannot take it from us.
        *value = map_.at(keys.front());
      }
    }
    if (missing.empty()) {
      return;
    }
    if (Clock::now() >= deadline) {
      throw TimeoutError(
          std::string("FileStore ") + op + ": " +
          internal::timed_out_message(timeout, missing) + " in '" + path_ + "'");
    }
    back_off(interval, deadline, kMaxPollInterval);
  }
}

} // namespace ddp
