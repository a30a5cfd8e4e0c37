#pragma once

// The first failure a group's ranks saw, kept in the group's store (private
// header). See Note [First failure] in failure_ledger.cpp.

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include <ddp/store/store.h>

namespace ddp::internal {

// One rank's account of a failure: the rank it blames, and how it saw it
// ("rank 2 lost its connection to it in allreduce #5").
struct FailureReport {
  int rank = -1;
  std::string seen;
};

// Thread-safety: safe to call from several threads (each call is one store
// operation, and the store serialises its own calls).
class FailureLedger {
 public:
  // `key`: the group's own key in `store` (one per group and generation).
  FailureLedger(std::shared_ptr<Store> store, std::string key);

  // Records `report` as the group's first failure unless one is recorded
  // already; returns the first failure (this one or the earlier one), or
  // nullopt when the store cannot be reached or holds something unreadable.
  // Never throws.
  std::optional<FailureReport> record(const FailureReport& report);

  // The first failure recorded so far, or nullopt. Never throws.
  std::optional<FailureReport> first();

 private:
  std::shared_ptr<Store> store_;
  const std::string key_;
};

// "; rank 3 failed first (rank 2 lost its connection to it in allreduce #5)"
// when `first` blames a rank that is not among `named` (the ranks the
// message already blames), else "".
std::string first_failure_clause(const std::optional<FailureReport>& first, const std::vector<int>& named);

// Runs `fn` on a thread of its own and waits at most `budget` for it:
// its result, or nullopt when it has not finished by then (it then finishes
// on its own, so `fn` must own, or share, everything it uses). For store
// calls that explain an error, whose server may be unreachable. Rethrows
// what `fn` throws.
template <typename T>
std::optional<T> run_within(std::chrono::milliseconds budget, std::function<T()> fn) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
  auto result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (result.wait_for(budget) != std::future_status::ready) {
    return std::nullopt;
  }
  return result.get();
}

} // namespace ddp::internal
