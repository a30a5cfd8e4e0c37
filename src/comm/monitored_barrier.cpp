// ProcessGroup::monitored_barrier: a barrier that says who is late.
//
// How it works (PyTorch's protocol, over this library's send/recv): every
// rank other than 0 sends one byte to rank 0, then waits for rank 0's byte
// back. Rank 0 waits for each rank's byte in rank order against one deadline
// (the call's start plus the timeout), noting each rank that misses it; only
// when all have arrived does it answer each of them. So a late rank is
// named by rank 0, and the other ranks, never answered, time out too.

#include <ddp/comm/process_group.h>

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <ddp/comm/error.h>

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  // A deadline that has passed still gets a moment: a token already
  // delivered is then taken, not reported late.
  return std::max(left, std::chrono::milliseconds(1));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += c10::str(i == 0 ? "" : ", ", ranks[i]);
  }
  return text;
}

} // namespace

void ProcessGroup::monitored_barrier(std::chrono::milliseconds timeout, bool wait_all_ranks) {
  const auto limit = resolve_timeout(timeout);
  const auto deadline = Clock::now() + limit;
  const std::string who = rank_prefix() + " monitored_barrier";
  if (size() == 1) {
    return;
  }
  auto token = at::zeros({1}, at::kByte);
  const auto options_until = [&](Clock::time_point until) {
    PointToPointOptions options;
    options.tag = kMonitoredBarrierTag;
    options.timeout = left_until(until);
    return options;
  };
  if (rank() != 0) {
    send(token, 0, options_until(deadline))->wait();
    try {
      recv(token, 0, options_until(deadline))->wait();
    } catch (const TimeoutError& e) {
      throw TimeoutError(c10::str(who, ": rank 0 did not release the barrier within ", limit.count(),
                                  " ms: some rank is late (rank 0's error names it). ", e.what()));
    } catch (const CommError& e) {
      // Rank 0's own deadline may pass first: its timed-out receive closes
      // the group's connections, which this rank sees as a lost connection.
      throw TimeoutError(c10::str(who, ": rank 0 did not release the barrier within ", limit.count(),
                                  " ms and closed its connections: some rank is late (rank 0's error "
                                  "names it), or rank 0 failed. ",
                                  e.what()));
    }
    return;
  }
  // Every receive is posted first: a Gloo receive that times out closes the
  // group's connections, so the later ones must already be in place to
  // count a rank that did arrive.
  std::vector<at::Tensor> tokens;
  std::vector<std::shared_ptr<Work>> receives;
  std::vector<int> late;
  std::string first_error;
  for (int r = 1; r < size(); ++r) {
    tokens.push_back(at::zeros({1}, at::kByte));
    try {
      receives.push_back(recv(tokens.back(), r, options_until(deadline)));
    } catch (const CommError& e) {
      receives.push_back(nullptr);
      late.push_back(r);
      first_error = first_error.empty() ? e.what() : first_error;
    }
  }
  for (int r = 1; r < size() && (wait_all_ranks || late.empty()); ++r) {
    const auto& work = receives[static_cast<size_t>(r - 1)];
    if (work == nullptr) {
      continue;
    }
    try {
      work->wait(left_until(deadline));
    } catch (const std::exception& e) {
      late.push_back(r);
      first_error = first_error.empty() ? error_message(e) : first_error;
    }
  }
  std::sort(late.begin(), late.end());
  if (!late.empty()) {
    throw TimeoutError(c10::str(
        who, ": ", late.size() == 1 ? "rank " : "ranks ", rank_list(late),
        " did not reach monitored_barrier within ", limit.count(),
        " ms", wait_all_ranks ? "" : " (the first late rank; pass wait_all_ranks to name all)",
        ". The receive said: ", first_error));
  }
  for (int r = 1; r < size(); ++r) {
    send(token, r, options_until(deadline))->wait();
  }
}

} // namespace ddp
