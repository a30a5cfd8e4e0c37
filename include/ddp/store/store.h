#pragma once

/// The key-value store that ranks meet through: rendezvous addresses, unique
/// ids, counters and agreement flags all pass through a Store.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

/// Default deadline of blocking store calls, as c10d's: 300 seconds.
constexpr std::chrono::milliseconds kDefaultStoreTimeout = std::chrono::seconds(300);

/// A key-value store shared by the ranks of a job.
///
/// Values are byte strings. `add` keeps its counter as the decimal text of
/// the number, so `get` of a counter key returns e.g. "3".
///
/// Thread-safety: every implementation is safe to call from many threads at
/// once; `set_timeout` affects calls that start after it returns.
class Store {
 public:
  /// `timeout` bounds every blocking call (`get`, `wait` without an explicit
  /// timeout, and a client's connection).
  explicit Store(std::chrono::milliseconds timeout = kDefaultStoreTimeout);
  virtual ~Store();

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Sets `key` to `value`, replacing any previous value.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// Sets `key` to the bytes of `value`.
  void set(const std::string& key, const std::string& value);

  /// Returns the value of `key`, waiting until it exists. Throws
  /// `TimeoutError` naming the key after `timeout()`.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  /// `get` with the value returned as a string.
  std::string get_string(const std::string& key);

  /// Adds `delta` to the integer counter at `key` (created as 0) and returns
  /// the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  /// Atomically sets `key` to `desired` if its value equals `expected`, and
  /// returns the value `key` holds afterwards. A missing key counts as equal
  /// to an empty `expected`; when the key is missing and `expected` is not
  /// empty, nothing is set and `expected` is returned (c10d's semantics).
  virtual std::vector<uint8_t> compare_set(
      const std::string& key,
      const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) = 0;

  /// True when every key in `keys` exists. Never blocks on a peer.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  /// Waits until every key in `keys` exists; throws `TimeoutError` listing
  /// the keys still missing once `timeout` has passed.
  virtual void wait(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) = 0;
  /// `wait` with the store's own timeout.
  void wait(const std::vector<std::string>& keys);

  /// Deletes `key`; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  /// The number of keys in the store.
  virtual int64_t num_keys() = 0;

  /// The deadline of blocking calls.
  std::chrono::milliseconds timeout() const;
  /// Changes the deadline of blocking calls started from now on.
  void set_timeout(std::chrono::milliseconds timeout);

 private:
  std::atomic<int64_t> timeout_ms_;
};

} // namespace ddp
