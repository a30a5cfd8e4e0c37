// The non-virtual helpers of the Store interface.

#include <ddp/store/store.h>

#include "store/store_util.h"
#include "internal/check.h"

#include <algorithm>

namespace ddp {

namespace {

void check_timeout(std::chrono::milliseconds timeout) {
  DDP_CHECK(
      timeout.count() > 0,
      "Store: timeout must be positive (got ", timeout.count(), " ms)");
}

} // namespace

Store::Store(std::chrono::milliseconds timeout) : timeout_ms_(timeout.count()) {
  check_timeout(timeout);
}

Store::~Store() = default;

void Store::set(const std::string& key, const std::string& value) {
  set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get_string(const std::string& key) {
  const std::vector<uint8_t> value = get(key);
  return std::string(value.begin(), value.end());
}

void Store::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout());
}

std::chrono::milliseconds Store::timeout() const {
  return std::chrono::milliseconds(timeout_ms_.load());
}

void Store::set_timeout(std::chrono::milliseconds timeout) {
  check_timeout(timeout);
  timeout_ms_.store(timeout.count());
}

} // namespace ddp

namespace ddp::internal {

std::string format_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    out += keys[i];
  }
  out += "]";
  return out;
}

std::string quote_value(const std::vector<uint8_t>& value) {
  constexpr size_t kMaxShown = 32;
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < value.size() && i < kMaxShown; ++i) {
    const uint8_t c = value[i];
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (value.size() > kMaxShown) {
    out += "...";
  }
  out += "'";
  return out;
}

int64_t add_to_counter(
    const char* op,
    const std::string& key,
    const std::optional<std::vector<uint8_t>>& value,
    int64_t delta) {
  int64_t counter = 0;
  if (value.has_value()) {
    // Parse by hand: std::stoll accepts leading blanks and trailing junk.
    const std::vector<uint8_t>& text = *value;
    size_t i = 0;
    bool negative = false;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) {
      negative = text[i] == '-';
      ++i;
    }
    bool ok = i < text.size() && text.size() - i <= 19;
    uint64_t magnitude = 0;
    for (; ok && i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') {
        ok = false;
        break;
      }
      magnitude = magnitude * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    const uint64_t limit = negative
        ? static_cast<uint64_t>(INT64_MAX) + 1
        : static_cast<uint64_t>(INT64_MAX);
    ok = ok && magnitude <= limit;
    DDP_CHECK(
        ok, op, ": the value of key '", key,
        "' is not a decimal int64 counter (got ", quote_value(text), ")");
    counter = negative ? static_cast<int64_t>(0 - magnitude)
                       : static_cast<int64_t>(magnitude);
  }
  int64_t sum = 0;
  DDP_CHECK(
      !__builtin_add_overflow(counter, delta, &sum), op, ": counter '", key,
      "' would overflow int64 (", counter, " + ", delta, ")");
  return sum;
}

std::vector<uint8_t> counter_bytes(int64_t counter) {
  const std::string text = std::to_string(counter);
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::optional<std::vector<uint8_t>> compare_set_outcome(
    const std::optional<std::vector<uint8_t>>& current,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired,
    std::vector<uint8_t>& result) {
  if (!current.has_value()) {
    if (expected.empty()) {
      result = desired;
      return desired;
    }
    result = expected;
    return std::nullopt;
  }
  if (*current == expected) {
    result = desired;
    return desired;
  }
  result = *current;
  return std::nullopt;
}

std::string timed_out_message(
    std::chrono::milliseconds timeout,
    const std::vector<std::string>& missing) {
  return "timed out after " + std::to_string(timeout.count()) +
      " ms waiting for " + (missing.size() == 1 ? "key " : "keys ") +
      format_keys(missing);
}

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::hours kCentury{24 * 365 * 100};
  const auto now = std::chrono::steady_clock::now();
  if (timeout > kCentury) {
    return now + kCentury;
  }
  return now + std::max(timeout, std::chrono::milliseconds(0));
}

} // namespace ddp::internal
