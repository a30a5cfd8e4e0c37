#pragma once

/// A view of another Store under a key prefix.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ddp/store/store.h>

namespace ddp {

/// Every key `k` becomes `prefix + "/" + k` in the base store, so that several
/// groups (or several uses) can share one store without their keys meeting.
///
/// Example:
/// `auto group_store = std::make_shared<ddp::PrefixStore>("default", tcp_store);`
///
/// The prefix store starts with the base store's timeout; `get` and `wait`
/// honour the prefix store's own timeout.
///
/// Thread-safety: as safe as the base store (every Store is thread-safe); the
/// prefix itself never changes.
class PrefixStore : public Store {
 public:
  /// Views `base` under `prefix`. `base` must not be null.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  ~PrefixStore() override;

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
  /// The number of keys in the *base* store, this prefix's and any other's
  /// (as c10d's PrefixStore: the Store interface cannot count by prefix).
  int64_t num_keys() override;

  /// The prefix, without the "/".
  const std::string& prefix() const;
  /// The store this one is a view of.
  const std::shared_ptr<Store>& base() const;

 private:
  std::string join(const std::string& key) const;
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

} // namespace ddp
