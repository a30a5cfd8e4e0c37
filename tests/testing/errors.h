#pragma once

// Checking the errors that the library throws.

#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace ddp::testing {

// The message of the c10::Error that `fn` throws (without the backtrace),
// or "<no error>" when it throws nothing. Other exceptions propagate, so a
// test that expects misuse to be reported as c10::Error fails on any other
// type.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.msg();
  }
  return "<no error>";
}

} // namespace ddp::testing

// Expects `statement` to throw c10::Error whose message contains `substring`.
#define DDP_EXPECT_ERROR(statement, substring)                                              \
  do {                                                                                      \
    const std::string ddp_message_ = ::ddp::testing::error_of([&] { (void)(statement); });  \
    EXPECT_NE(ddp_message_.find(substring), std::string::npos)                              \
        << "expected an error containing \"" << (substring) << "\", got: " << ddp_message_; \
  } while (false)
