#pragma once

// Error helpers used across the library (private header).
//
// DDP_CHECK(cond, parts...) throws c10::Error, as TORCH_CHECK does, with the
// parts concatenated; callers put "[rank R/W] op: " first (see STYLE.md §4).
// DDP_INTERNAL_ASSERT(cond, parts...) marks a broken invariant of ours.

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <string>

namespace ddp::internal {

[[noreturn]] void throw_check_error(
    const char* function,
    const char* file,
    uint32_t line,
    const std::string& message);

} // namespace ddp::internal

#define DDP_CHECK(cond, ...)                                                  \
  do {                                                                        \
    if (C10_UNLIKELY(!(cond))) {                                              \
      ::ddp::internal::throw_check_error(                                     \
          __func__, __FILE__, static_cast<uint32_t>(__LINE__),                \
          ::c10::str(__VA_ARGS__));                                           \
    }                                                                         \
  } while (false)

#define DDP_INTERNAL_ASSERT(cond, ...)                                        \
  do {                                                                        \
    if (C10_UNLIKELY(!(cond))) {                                              \
      ::ddp::internal::throw_check_error(                                     \
          __func__, __FILE__, static_cast<uint32_t>(__LINE__),                \
          ::c10::str("internal error in ddp, please report it: ", #cond,      \
                     " failed. ", ##__VA_ARGS__));                            \
    }                                                                         \
  } while (false)
