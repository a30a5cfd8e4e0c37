#pragma once

// Helpers shared by the Store implementations (private header). Defined in
// store.cpp.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::internal {

/// "[a, b]": the keys as error messages list them.
std::string format_keys(const std::vector<std::string>& keys);

/// `value` as a quoted, escaped, possibly shortened string for messages.
std::string quote_value(const std::vector<uint8_t>& value);

/// The counter `value` held by `key` plus `delta`: the arithmetic of
/// `Store::add`. Throws c10::Error naming `op` and `key` when the value is not
/// a decimal integer or the sum overflows int64.
int64_t add_to_counter(
    const char* op,
    const std::string& key,
    const std::optional<std::vector<uint8_t>>& value,
    int64_t delta);

/// The decimal text of `counter`, as `add` stores it.
std::vector<uint8_t> counter_bytes(int64_t counter);

/// What `compare_set` does to a key whose value is `current` (nullopt when
/// missing): `desired` when the swap happens, nullopt when it does not.
/// `result` receives the value compare_set returns. See Store::compare_set.
std::optional<std::vector<uint8_t>> compare_set_outcome(
    const std::optional<std::vector<uint8_t>>& current,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired,
    std::vector<uint8_t>& result);

/// Now plus `timeout`, saturating at a century from now, so that a huge
/// timeout (milliseconds::max() as "forever") cannot overflow the clock.
std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout);

/// "timed out after 200 ms waiting for key [a]" / "keys [a, b]".
std::string timed_out_message(
    std::chrono::milliseconds timeout,
    const std::vector<std::string>& missing);

} // namespace ddp::internal
