// PrefixStore: forwards every call to the base store with "prefix/" in front
// of each key.

#include <ddp/store/prefix_store.h>

#include "internal/check.h"

namespace ddp {

namespace {

std::chrono::milliseconds timeout_of(const std::shared_ptr<Store>& base) {
  DDP_CHECK(base != nullptr, "PrefixStore: the base store is null");
  return base->timeout();
}

} // namespace

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : Store(timeout_of(base)), prefix_(std::move(prefix)), base_(std::move(base)) {}

PrefixStore::~PrefixStore() = default;

void PrefixStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  base_->set(join(key), value);
}

std::vector<uint8_t> PrefixStore::get(const std::string& key) {
  const std::string full_key = join(key);
  // The base's get waits with the base's timeout; when ours differs, wait
  // with ours first so that our deadline is the one that applies.
  if (timeout() != base_->timeout()) {
    base_->wait({full_key}, timeout());
  }
  return base_->get(full_key);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(join(key), delta);
}

std::vector<uint8_t> PrefixStore::compare_set(
    const std::string& key,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  return base_->compare_set(join(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(join(keys));
}

void PrefixStore::wait(
    const std::vector<std::string>& keys,
    std::chrono::milliseconds timeout) {
  base_->wait(join(keys), timeout);
}

bool PrefixStore::delete_key(const std::string& key) {
  return base_->delete_key(join(key));
}

int64_t PrefixStore::num_keys() {
  return base_->num_keys();
}

const std::string& PrefixStore::prefix() const {
  return prefix_;
}

const std::shared_ptr<Store>& PrefixStore::base() const {
  return base_;
}

std::string PrefixStore::join(const std::string& key) const {
  return prefix_ + "/" + key;
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    out.push_back(join(key));
  }
  return out;
}

} // namespace ddp
