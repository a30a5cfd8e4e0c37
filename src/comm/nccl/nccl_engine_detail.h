#pragma once

// What the NCCL engine's files share (private header): its timing constants
// and small helpers for errors and store keys. nccl_engine.cpp (the
// communicator, launches), nccl_work.cpp (NcclWork, NcclFailure) and
// nccl_watchdog.cpp (the watchdog and Note [NCCL fingerprint check]'s
// comparisons) use it.

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <ddp/comm/error.h>

namespace ddp::internal::nccl_detail {

// How often the watchdog polls end events while operations are pending: the
// latency with which it completes a Work nobody waits on (and so runs its
// `then` callbacks). Cheap: one cudaEventQuery per pending operation.
inline constexpr std::chrono::microseconds kBusyPoll{500};

// The longest the destructor waits for ncclCommFinalize before aborting.
inline constexpr std::chrono::milliseconds kFinalizeTimeout = std::chrono::seconds(60);

// See Note [NCCL fingerprint check]. A collective pending this long has its
// fingerprint published and compared, as in Gloo's monitor...
inline constexpr std::chrono::milliseconds kStallDelay{1000};
// ... again this often while it stays pending.
inline constexpr std::chrono::milliseconds kCompareInterval{250};
// How long the watchdog looks for the call a peer made after the check
// found a difference (capped by the operation's timeout): long enough for a
// peer whose kernel hangs to publish from its stall check.
inline constexpr std::chrono::milliseconds kExplainPatience{5000};
inline constexpr std::chrono::milliseconds kExplainInterval{50};

// The text of an exception, without c10's backtrace.
inline std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return error_message(e);
  } catch (...) {
    return "unknown error";
  }
}

// `failure` followed by what to do about it, unless it says so already.
inline std::string with_advice(const std::string& failure) {
  constexpr const char* kAdvice = "destroy it and create a new one";
  if (failure.find(kAdvice) != std::string::npos) {
    return failure;
  }
  return c10::str(failure, " The group is unusable: ", kAdvice, ".");
}

inline std::exception_ptr aborted_error(const std::string& name, const std::string& failure) {
  return std::make_exception_ptr(CommError(
      c10::str(name, ": aborted, because the process group failed: ", with_advice(failure))));
}

// "ddp/<group>/nccl/<generation>/": groups are numbered per (name, rank) in
// creation order, the same on every rank, so that a group created again
// with the same name and store does not meet its predecessor's keys. The
// rank is part of the key because tests run ranks as threads of one process.
inline std::string group_prefix(const std::string& group_name, int rank) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, int> generations; // guarded by mutex
  std::lock_guard<std::mutex> lock(mutex);
  const int generation = generations[{group_name, rank}]++;
  return c10::str("ddp/", group_name, "/nccl/", generation, "/");
}

inline bool is_mismatch(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveMismatchError&) {
    return true;
  } catch (...) {
    return false;
  }
}

inline std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

} // namespace ddp::internal::nccl_detail
