#pragma once

/// An in-memory Store for the threads of one process.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ddp/store/store.h>

namespace ddp {

/// A Store held in this process's memory: ranks that run as threads of one
/// process (tests, single-process simulations) meet through it.
///
/// Example:
/// `auto store = std::make_shared<ddp::HashStore>(std::chrono::seconds(10));`
///
/// Thread-safety: safe to call from many threads at once. `get` and `wait`
/// sleep on a condition variable until another thread sets the key or the
/// deadline passes.
class HashStore : public Store {
 public:
  /// An empty store whose blocking calls give up after `timeout`.
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultStoreTimeout);
  ~HashStore() override;

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

 private:
  // Waits on `changed_` until every key exists; throws TimeoutError naming
  // `op` and the missing keys. `lock` holds `mutex_`.
  void wait_locked(
      std::unique_lock<std::mutex>& lock,
      const char* op,
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout);

  std::mutex mutex_;
  // Notified whenever a key is created or changed. Guarded by mutex_.
  std::condition_variable changed_;
  // Guarded by mutex_.
  std::unordered_map<std::string, std::vector<uint8_t>> map_;
};

} // namespace ddp
