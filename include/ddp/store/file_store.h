#pragma once

/// A Store kept in a file, for the processes of one host (or of a shared
/// file system with working `flock`).

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <unordered_map>
#include <vector>

#include <ddp/store/store.h>

namespace ddp {

/// A Store whose contents live in the file at `path`: every process that
/// opens a FileStore on the same path sees the same keys. The file is an
/// append-only log of records, written under an exclusive `flock` (the format
/// is described at the top of file_store.cpp). `get` and `wait` poll the file
/// with a backoff of up to 50 ms until the deadline.
///
/// Example:
/// `auto store = std::make_shared<ddp::FileStore>("/tmp/job42.store");`
///
/// The file is created when missing and never deleted: the caller removes it
/// once the job is over, and must not remove or rewrite it while in use. Each
/// `add` appends a record, so the file grows with the number of writes.
///
/// Thread-safety: safe to call from many threads and many processes at once.
/// A FileStore inherited across `fork()` reopens its file in the child on
/// first use (an `flock` is shared between the copies of one open file).
class FileStore : public Store {
 public:
  /// Opens (creating if needed) the store file at `path`. Throws IoError when
  /// the file cannot be opened or is not a store file.
  explicit FileStore(
      std::string path,
      std::chrono::milliseconds timeout = kDefaultStoreTimeout);
  ~FileStore() override;

  /// See Store::set.
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::set;
  /// See Store::get.
  std::vector<uint8_t> get(const std::string& key) override;
  /// See Store::add.
  int64_t add(const std::string& key, int64_t delta) override;
  /// See Store::compare_set.
  std::vector<uint8_t> compare_set(
      const std::string& key,
      const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override;
  /// See Store::check.
  bool check(const std::vector<std::string>& keys) override;
  /// See Store::wait.
  void wait(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) override;
  using Store::wait;
  /// See Store::delete_key.
  bool delete_key(const std::string& key) override;
  /// See Store::num_keys.
  int64_t num_keys() override;

  /// The path of the store file.
  const std::string& path() const;

 private:
  class FileLock;

  // Opens `path_` into `fd_` if this process has not (after a fork, the
  // parent's descriptor would share its flock with ours). Holds mutex_.
  void ensure_open_locked();
  // Reads the records appended since `offset_` into `map_`. The caller holds
  // mutex_ and an flock. With `truncate_torn_tail` (exclusive lock only), a
  // record left half-written by a writer that died is cut off.
  void refresh_locked(const char* op, bool truncate_torn_tail);
  // Takes the shared lock and refreshes if the file grew. Holds mutex_.
  void poll_locked(const char* op);
  // Appends one record at the end of the file. Holds mutex_ and the
  // exclusive flock.
  void append_locked(const char* op, const std::vector<uint8_t>& record);
  // Polls until every key exists; throws TimeoutError naming `op`. When
  // `value` is not null, it receives the value of keys[0].
  void wait_for(
      const char* op,
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout,
      std::vector<uint8_t>* value);

  const std::string path_;

  // Serializes this process's threads: an flock belongs to the open file, so
  // it does not exclude the other threads that share `fd_`.
  std::mutex mutex_;
  // Guarded by mutex_: the descriptor, the process that opened it, how far
  // the log has been read, and the map that the records read so far give.
  int fd_ = -1;
  pid_t fd_pid_ = 0;
  int64_t offset_ = 0;
  std::unordered_map<std::string, std::vector<uint8_t>> map_;
};

} // namespace ddp
