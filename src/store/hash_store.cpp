// HashStore: a map under a mutex; blocking calls wait on a condition variable
// that every write notifies.

#include <ddp/store/hash_store.h>

#include <ddp/comm/error.h>

#include "store/store_util.h"
#include "internal/check.h"

namespace ddp {

HashStore::HashStore(std::chrono::milliseconds timeout) : Store(timeout) {}

HashStore::~HashStore() = default;

void HashStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key] = value;
  }
  changed_.notify_all();
}

std::vector<uint8_t> HashStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, "get", {key}, timeout());
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    std::optional<std::vector<uint8_t>> current;
    if (it != map_.end()) {
      current = it->second;
    }
    result = internal::add_to_counter("HashStore add", key, current, delta);
    map_[key] = internal::counter_bytes(result);
  }
  changed_.notify_all();
  return result;
}

std::vector<uint8_t> HashStore::compare_set(
    const std::string& key,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  std::vector<uint8_t> result;
  bool swapped = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    std::optional<std::vector<uint8_t>> current;
    if (it != map_.end()) {
      current = it->second;
    }
    auto next = internal::compare_set_outcome(current, expected, desired, result);
    if (next.has_value()) {
      map_[key] = std::move(*next);
      swapped = true;
    }
  }
  if (swapped) {
    changed_.notify_all();
  }
  return result;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    if (map_.count(key) == 0) {
      return false;
    }
  }
  return true;
}

void HashStore::wait(
    const std::vector<std::string>& keys,
    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, "wait", keys, timeout);
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(map_.size());
}

void HashStore::wait_locked(
    std::unique_lock<std::mutex>& lock,
    const char* op,
    const std::vector<std::string>& keys,
    std::chrono::milliseconds timeout) {
  DDP_CHECK(
      timeout.count() >= 0, "HashStore ", op,
      ": timeout must not be negative (got ", timeout.count(), " ms)");
  const auto deadline = internal::deadline_after(timeout);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (map_.count(key) == 0) {
        return false;
      }
    }
    return true;
  };
  if (changed_.wait_until(lock, deadline, all_present)) {
    return;
  }
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (map_.count(key) == 0) {
      missing.push_back(key);
    }
  }
  throw TimeoutError(
      std::string("HashStore ") + op + ": " +
      internal::timed_out_message(timeout, missing));
}

} // namespace ddp
