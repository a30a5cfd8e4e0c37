// The NCCL engine's watchdog: completes operations whose end event has
// passed, fails those past their deadline, and runs the fingerprint check of
// the note below on operations that stall.
//
// Note [NCCL fingerprint check]
// NCCL collectives carry no tag, so ranks that call different collectives
// at the same point of their sequence (Note [Collective fingerprints]) meet
// inside NCCL: calls that move as many bytes complete with garbage (float32
// against int32, SUM against MAX, two ranks that each think they are the
// root), and calls that do not may hang. With more than one rank, every
// collective (barrier included; not send/recv, which have no sequence
// number) is checked in two ways.
//
// On the GPU, in its own launch. The launch writes (h, -h), h being the
// fingerprint's hash63(), into a pinned host slot (FingerprintSlots),
// copies it to the slot's device half, and, inside the operation's
// ncclGroupStart/End and before the operation's own calls, adds an
// ncclAllReduce MAX of those two int64. After the group it copies the 16
// bytes back to the host slot, before the end event. The check is the same
// call on every rank, first in every group, so it always matches. Once the
// end event has completed, the slot holds (largest h, -smallest h), and
// hashes_agree() tells whether every rank called the same thing. Whoever
// sees the event complete reads it: the watchdog, or NcclWork::wait with a
// timeout. A Work whose check found a difference never completes
// successfully: NcclWork::finish leaves it to the watchdog, which asks the
// store which call each rank made (explain_hash_difference: this rank
// publishes its fingerprint and waits, a few seconds at most, for a peer's
// that differs; a peer whose collective hangs publishes from its stall
// check, below), records CollectiveMismatchError as the group's failure and
// aborts the communicator (Note [NCCL failure]). Unlike MPI's check, this
// one runs with the collective, not before it: the mismatched calls may
// have moved data, so the group is unusable afterwards.
//
// When stalled. A hung kernel never delivers the check's result. As Gloo's
// monitor does, the watchdog publishes the fingerprint of the oldest
// unfinished checked collective (the stream runs them in order, so only it
// can hold the others up) once it has been running on the GPU for
// kStallDelay, and compares it with the other ranks' every
// kCompareInterval, with non-blocking store reads. Running, not pending: an
// event recorded before the operation (after its wait for the caller's
// stream) tells when it started, so that a collective queued behind a long
// computation costs no store traffic, which at scale would fall on one
// store server from every rank. A launch that NCCL keeps waiting
// (ncclGroupEnd setting up connections that a peer's different call never
// sets up) does the same from its polling loop. A difference fails the
// group with CollectiveMismatchError and aborts the communicator, which
// ends the stuck kernels; each rank's own watchdog finds the other's
// fingerprint, so every rank raises it. A timeout or an NCCL error (a peer
// that aborted first) also looks for a mismatch in the store before it
// reports itself; a timeout names the ranks that had not published the
// collective (ranks_missing), as Gloo's does.
//
// Cost, with more than one rank: a 16-byte host-to-device copy, a 16-byte
// allreduce in the same kernel launch as the collective, a 16-byte
// device-to-host copy, one more event, and a slot taken and given back;
// nothing on the CPU waits for them. With one rank there is no check:
// nothing is allocated, copied or published, and the launch is what it was.
//
// What is left: a non-blocking wait() completes the Work before the GPU has
// run it (docs/gpu.md), so that Work counts as a success even if its check
// then finds a difference; the watchdog still fails the group, and a later
// operation reports it (one that matched and completed before the watchdog
// got there still succeeds: each Work answers for its own check). And two
// different calls whose 63-bit hashes are equal are not told apart.

#include "comm/nccl/nccl_engine.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <thread>

#include <ddp/comm/error.h>

#include "comm/nccl/nccl_engine_detail.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::internal {

using namespace nccl_detail;

// ---- Watchdog --------------------------------------------------------------------------------

void NcclEngine::run_watchdog() {
  std::unique_lock<std::mutex> lock(pending_mutex_);
  for (;;) {
    if (pending_.empty()) {
      if (stop_watchdog_) {
        return;
      }
      pending_cv_.wait_for(lock, options_.watchdog_interval,
                           [this] { return stop_watchdog_ || !pending_.empty(); });
    } else {
      pending_cv_.wait_for(lock, kBusyPoll);
    }
    const std::vector<std::shared_ptr<NcclWork>> snapshot(pending_.begin(), pending_.end());
    lock.unlock();
    std::vector<std::shared_ptr<NcclWork>> done;
    try {
      done = check_pending(snapshot);
    } catch (const std::exception& e) {
      // check_pending turns every failure into a failed group; this is a
      // last resort so that the thread never dies with Works pending.
      try {
        fail_group_from_watchdog(std::make_exception_ptr(
            CommError(c10::str(who_, " NCCL watchdog: ", error_message(e)))));
        for (const auto& work : snapshot) {
          work->fail(aborted_error(work->name(), error_message(e)));
        }
      } catch (...) {
      }
      done = snapshot;
    }
    lock.lock();
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&done](const std::shared_ptr<NcclWork>& work) {
                                    return std::find(done.begin(), done.end(), work) != done.end();
                                  }),
                   pending_.end());
  }
}

std::vector<std::shared_ptr<NcclWork>> NcclEngine::check_pending(
    const std::vector<std::shared_ptr<NcclWork>>& pending) {
  auto fail_others = [&pending](const std::shared_ptr<NcclWork>& culprit, const std::string& failure) {
    for (const auto& work : pending) {
      if (work != culprit) {
        work->fail(aborted_error(work->name(), failure));
      }
    }
  };

  // A failure recorded by a launch or by an earlier pass: fail everything.
  if (auto failure = failure_->message()) {
    fail_others(nullptr, *failure);
    return pending;
  }

  // An asynchronous error of the communicator (a peer that died, a network
  // error). Skipped while a launch holds the lock: that launch polls the
  // same state itself.
  std::optional<ncclResult_t> async_error;
  std::string nccl_said;
  {
    std::unique_lock<std::mutex> launch_lock(launch_mutex_, std::try_to_lock);
    if (launch_lock.owns_lock() && comm_ != nullptr) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
      if (result != ncclSuccess) {
        state = result;
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        async_error = state;
        const char* last = ncclGetLastError(comm_);
        nccl_said = last != nullptr ? last : "";
      }
    }
  }
  if (async_error) {
    const std::shared_ptr<NcclWork> culprit = pending.empty() ? nullptr : pending.front();
    std::string message;
    std::exception_ptr error;
    // A peer that found a mismatch aborted its communicator: say so.
    if (culprit && culprit->fingerprint()) {
      if (auto mismatch = compare_fingerprint(*culprit->fingerprint())) {
        message = c10::str(culprit->name(), ": ", *mismatch);
        error = std::make_exception_ptr(CollectiveMismatchError(message));
      }
    }
    if (!error) {
      message = c10::str(
          culprit ? culprit->name() : who_ + " (no operation running)",
          ": NCCL reported an asynchronous error: ", nccl_result_text(*async_error),
          nccl_said.empty() ? std::string() : "; NCCL said: " + nccl_said,
          ". The NCCL communicator was aborted; the group is unusable: destroy it and create a new "
          "one.");
      error = *async_error == ncclRemoteError ? std::make_exception_ptr(RemoteError(message, -1))
                                              : std::make_exception_ptr(CommError(message));
    }
    if (culprit) {
      culprit->fail(error);
    }
    fail_group_from_watchdog(error);
    fail_others(culprit, message);
    return pending;
  }

  // A mismatch (Note [NCCL fingerprint check]) fails `work` and the group.
  auto fail_with_mismatch = [&](const std::shared_ptr<NcclWork>& work, const std::string& mismatch) {
    const std::string message = c10::str(work->name(), ": ", mismatch);
    const auto error = std::make_exception_ptr(CollectiveMismatchError(message));
    work->fail(error);
    fail_group_from_watchdog(error);
    fail_others(work, message);
  };

  // Completions and deadlines, oldest first.
  std::vector<std::shared_ptr<NcclWork>> done;
  const auto now = std::chrono::steady_clock::now();
  bool stall_compared = false; // only the oldest unfinished checked Work
  for (const auto& work : pending) {
    bool completed = false;
    try {
      completed = work->end_event().query();
    } catch (const std::exception& e) {
      const auto error =
          std::make_exception_ptr(CommError(c10::str(work->name(), ": ", error_message(e))));
      work->fail(error);
      fail_group_from_watchdog(error);
      fail_others(work, error_message(e));
      return pending;
    }
    if (completed) {
      // The check's verdict comes before any success; a failure recorded
      // before the event completed (an abort completes it) comes first.
      if (work->check_found_difference() && !failure_->message()) {
        const auto patience = std::min(work->timeout(), kExplainPatience);
        fail_with_mismatch(work, explain_hash_difference(*fingerprints_, *work->fingerprint(),
                                                         patience, kExplainInterval));
        return pending;
      }
      // Callbacks run here; whatever they queue goes on the stream the
      // operation was issued from, as if they ran on the issuing thread.
      c10::cuda::CUDAStreamGuard guard(work->issuing_stream());
      work->finish();
      done.push_back(work);
    } else if (now >= work->deadline()) {
      if (work->fingerprint()) {
        if (auto mismatch = compare_fingerprint(*work->fingerprint())) {
          fail_with_mismatch(work, *mismatch);
          return pending;
        }
      }
      const std::string message = c10::str(
          work->name(), " timed out after ", work->timeout().count(),
          " ms: it had not completed on the GPU (a rank may be stuck, dead, or issuing collectives "
          "in a different order)", missing_ranks_clause(*work),
          ". The NCCL communicator was aborted; the group is unusable: destroy it and create a new "
          "one.");
      const auto error = std::make_exception_ptr(TimeoutError(message));
      work->fail(error);
      fail_group_from_watchdog(error);
      fail_others(work, message);
      return pending;
    } else if (!stall_compared && work->fingerprint()) {
      stall_compared = true;
      if (stall_.seq != work->fingerprint()->seq || !stall_.running_since) {
        stall_ = StallWatch{work->fingerprint()->seq, std::nullopt, {}};
        if (work->started_on_gpu()) {
          stall_.running_since = now;
        }
      }
      if (stall_.running_since && now - *stall_.running_since >= kStallDelay &&
          now >= stall_.next_comparison) {
        stall_.next_comparison = now + kCompareInterval;
        if (auto mismatch = compare_fingerprint(*work->fingerprint())) {
          fail_with_mismatch(work, *mismatch);
          return pending;
        }
      }
    }
  }
  return done;
}

std::optional<std::string> NcclEngine::compare_fingerprint(const Fingerprint& fingerprint) noexcept {
  try {
    return fingerprints_->publish_and_compare(fingerprint);
  } catch (...) {
    return std::nullopt; // the store failed: the operation ends at its deadline instead
  }
}

std::string NcclEngine::missing_ranks_clause(const NcclWork& work) noexcept {
  // Before kStallDelay no rank has published (a peer that reached the
  // collective would be named as missing).
  if (!work.fingerprint() || work.timeout() <= kStallDelay) {
    return "";
  }
  try {
    const auto& fingerprint = *work.fingerprint();
    return fingerprints_->ranks_missing(fingerprint.seq).clause(fingerprint.op, fingerprint.seq);
  } catch (...) {
    return "";
  }
}

void NcclEngine::fail_group_from_watchdog(std::exception_ptr error) {
  // Recorded before the abort (See Note [NCCL failure]), and before taking
  // the lock, so that a launch in progress sees it.
  failure_->record(error, error_text(error));
  abort_requested_.store(true);
  std::lock_guard<std::mutex> lock(launch_mutex_);
  abort_communicator_locked();
  abort_requested_.store(false);
}

} // namespace ddp::internal
