// Note [First failure]
// With more than two ranks, the rank that a survivor's error names is the
// peer whose connection it lost, which is not always the rank that failed:
// with 4 ranks in a ring and rank 3 killed, ranks 2 and 0 lose their
// connections to rank 3, fail, and exit; rank 1 then loses its connection to
// rank 2, and its error blamed rank 2. The group's store can say which came
// first. The first rank to fail on a known peer (a lost connection) or on
// known absentees (a timeout while some ranks had not reached the
// collective, FingerprintExchange::ranks_missing; or a peer whose process
// a cross-memory read found gone) records whom it blames
// with one compare-and-set on the group's key, before its error reaches the
// caller; every later failing rank's compare-and-set finds that record and
// its error says "rank 3 failed first (rank 2 lost its connection to it in
// allreduce #5)" when it blames another rank itself. The order holds
// because a survivor's peers see its connections close only once it exits
// or shuts them down, after it has written the record; except after a Gloo
// timeout, whose rank's connections Gloo closes before it writes anything:
// its peers then blame the ranks that had not arrived when they waited long
// (Note [A lost peer that timed out] in comm/gloo/process_group_gloo_impl.h).
//
// These store calls run within a budget of their own (run_within, 1 s in
// the Gloo group): when the store's server is unreachable (a link down
// between hosts), the error comes without them, saying that the store did
// not answer, instead of after the store's own deadline.
//
// The store usually lives in rank 0's process, which may end at once after
// its own error, taking the store with it before the others have read it:
// their errors then name the peer they lost alone, and the analyzer follows
// those (Note [Launcher's account]). Keeping rank 0's store up a moment
// after a failure was tried and dropped: a process that lingers at exit
// is stopped by its launcher instead of ending on its own, which torchrun
// counts differently (a membership change, not a failure, so its restart
// count stays 0).
//
// What it cannot know: a rank that a launcher or the user stopped before it
// failed on its own is blamed by whoever lost it first, and a store that
// lives in a dead process (rank 0 hosts it under ddprun and torchrun)
// cannot be read; the errors then name the peer alone, as before. One
// record per group and generation: a restarted job starts a new one. The
// analyzer (`ddprun --analyze`) reads these clauses from the dumps, and
// ddprun adds its own account of the first rank to exit
// (Note [Launcher's account] in src/launch/supervisor.cpp).

#include "comm/failure_ledger.h"

#include <algorithm>
#include <cstdlib>

#include <c10/util/StringUtil.h>

namespace ddp::internal {

namespace {

// "<rank>\n<seen>".
std::vector<uint8_t> encode(const FailureReport& report) {
  const std::string text = std::to_string(report.rank) + "\n" + report.seen;
  return {text.begin(), text.end()};
}

std::optional<FailureReport> decode(const std::vector<uint8_t>& bytes) {
  const std::string text(bytes.begin(), bytes.end());
  const auto newline = text.find('\n');
  if (newline == std::string::npos || newline == 0 || newline > 9) {
    return std::nullopt;
  }
  const std::string digits = text.substr(0, newline);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return FailureReport{std::atoi(digits.c_str()), text.substr(newline + 1)};
}

} // namespace

FailureLedger::FailureLedger(std::shared_ptr<Store> store, std::string key)
    : store_(std::move(store)), key_(std::move(key)) {}

std::optional<FailureReport> FailureLedger::record(const FailureReport& report) {
  try {
    return decode(store_->compare_set(key_, {}, encode(report)));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<FailureReport> FailureLedger::first() {
  try {
    if (!store_->check({key_})) {
      return std::nullopt;
    }
    return decode(store_->get(key_));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string first_failure_clause(const std::optional<FailureReport>& first, const std::vector<int>& named) {
  if (!first || std::find(named.begin(), named.end(), first->rank) != named.end()) {
    return "";
  }
  return c10::str("; rank ", first->rank, " failed first (", first->seen, ")");
}

} // namespace ddp::internal
