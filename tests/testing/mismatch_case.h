#pragma once

// The cases of the collective-mismatch tests (Note [Collective
// fingerprints]), shared by every backend's test so that each checks the
// same message: tests/comm/gloo/collective_mismatch_test.cpp and
// tests/gpu/nccl_fingerprint_test.cpp.

#include <gtest/gtest.h>

#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>

#include <ddp/comm/error.h>
#include <ddp/comm/process_group.h>

namespace ddp::testing {

// Exit codes the ranks of a mismatch test use to report what they saw.
constexpr int kSawExpected = 10;
constexpr int kSawWrongMessage = 11;
constexpr int kSawOtherError = 12;
constexpr int kNoError = 13;
constexpr int kLaterNotFailed = 14;
constexpr int kTooSlow = 15;

// One mismatch: what each rank calls, and how each rank's call reads in
// the message ("allreduce #1 with float32[1000] SUM").
struct MismatchCase {
  std::string name;
  std::function<std::shared_ptr<Work>(ProcessGroup& pg, int rank)> call;
  std::function<std::string(int rank)> describe;
};

inline void PrintTo(const MismatchCase& c, std::ostream* os) {
  *os << c.name;
}

inline std::string mismatch_case_name(const ::testing::TestParamInfo<MismatchCase>& info) {
  return info.param.name;
}

// The message rank `rank` of 2 must raise: "[rank 1/2] allreduce #1: rank 0
// called allreduce #1 with float32[1000] SUM, this rank float32[2000] SUM"
// (the op once when both ranks called the same one).
inline std::string expected_mismatch_message(const MismatchCase& c, int rank) {
  const int other = 1 - rank;
  const std::string mine = c.describe(rank);
  const std::string theirs = c.describe(other);
  const std::string my_op = mine.substr(0, mine.find(' '));
  const std::string their_op = theirs.substr(0, theirs.find(' '));
  const std::string my_part = my_op == their_op ? mine.substr(mine.find(" with ") + 6) : mine;
  return c10::str("[rank ", rank, "/2] ", my_op, " #1: rank ", other, " called ", theirs,
                  ", this rank ", my_part);
}

// One rank of a mismatch test, on any backend: after a matched allreduce
// of `warmup` (#0), rank `rank` makes its call of `c` (#1), waiting at most
// `wait_limit`; it must raise CollectiveMismatchError with
// expected_mismatch_message() within `within`, and the group's next
// collective must then fail at once (CommError). Returns kSawExpected or
// what went wrong.
inline int run_mismatch_case(ProcessGroup& pg, const MismatchCase& c, int rank, const at::Tensor& warmup,
                             std::chrono::milliseconds within, std::chrono::milliseconds wait_limit) {
  pg.allreduce(warmup)->wait(wait_limit);
  const auto start = std::chrono::steady_clock::now();
  try {
    c.call(pg, rank)->wait(wait_limit);
  } catch (const CollectiveMismatchError& e) {
    const auto took = std::chrono::steady_clock::now() - start;
    const std::string expected = expected_mismatch_message(c, rank);
    std::fprintf(stderr, "after %.2f s: %s\n", std::chrono::duration<double>(took).count(), e.what());
    if (std::string(e.what()).find(expected) == std::string::npos) {
      std::fprintf(stderr, "expected the message to contain: %s\n", expected.c_str());
      return kSawWrongMessage;
    }
    if (took > within) {
      return kTooSlow;
    }
    try {
      pg.allreduce(warmup)->wait(wait_limit);
    } catch (const CommError& later) {
      std::fprintf(stderr, "then: %s\n", later.what());
      return kSawExpected;
    }
    return kLaterNotFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected error: %s\n", e.what());
    return kSawOtherError;
  }
  return kNoError;
}

// One rank of the test "a timeout names the rank that never arrived", on
// any backend: after a first allreduce of `t` that both ranks make, rank 1
// never calls allreduce #1 and stays `rank1_stays` (until rank 0 has given
// up); rank 0's allreduce #1, with a 2.5 s timeout, must fail within
// `wait_limit` with a TimeoutError saying "rank(s) [1] had not reached
// allreduce #1". Returns kSawExpected or what went wrong.
inline int run_timeout_names_missing_rank(ProcessGroup& pg, int rank, const at::Tensor& t,
                                          std::chrono::milliseconds rank1_stays,
                                          std::chrono::milliseconds wait_limit) {
  pg.allreduce(t)->wait(wait_limit);
  if (rank == 1) {
    std::this_thread::sleep_for(rank1_stays);
    return kSawExpected;
  }
  AllreduceOptions options;
  options.timeout = std::chrono::milliseconds(2500);
  try {
    pg.allreduce(t, options)->wait(wait_limit); // longer: the operation's own deadline must fire
  } catch (const TimeoutError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    const bool names_rank =
        std::string(e.what()).find("rank(s) [1] had not reached allreduce #1") != std::string::npos;
    return names_rank ? kSawExpected : kSawWrongMessage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected error: %s\n", e.what());
    return kSawOtherError;
  }
  return kNoError;
}

} // namespace ddp::testing
