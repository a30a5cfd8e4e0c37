// NcclWork and NcclFailure of the NCCL engine: a launched operation, waited
// on by its caller or completed by the watchdog, and the group's first
// failure (Note [NCCL failure] in nccl_engine.h).

#include "comm/nccl/nccl_engine.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <thread>

#include <ddp/comm/error.h>

#include "comm/nccl/nccl_engine_detail.h"
#include "flight_recorder/flight_recorder.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::internal {

using namespace nccl_detail;

// ---- NcclFailure -------------------------------------------------------------------

bool NcclFailure::record(std::exception_ptr error, std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) {
    return false;
  }
  error_ = std::move(error);
  message_ = std::move(message);
  return true;
}

std::optional<std::string> NcclFailure::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) {
    return std::nullopt;
  }
  return message_;
}

// ---- NcclWork ------------------------------------------------------------------------

NcclWork::NcclWork(std::string name, NcclOp& op, int device, c10::cuda::CUDAStream issuing_stream,
                   std::shared_ptr<NcclFailure> failure, std::unique_ptr<NcclCheck> check)
    : Work(std::move(name), op.timeout),
      timeout_(op.timeout),
      deadline_(std::chrono::steady_clock::now() + op.timeout),
      device_(device),
      issuing_stream_(issuing_stream),
      failure_(std::move(failure)),
      outputs_(std::move(op.outputs)),
      blocking_wait_(op.blocking_wait),
      check_(std::move(check)) {}

bool NcclWork::claim() {
  std::lock_guard<std::mutex> lock(claim_mutex_);
  if (claimed_) {
    return false;
  }
  claimed_ = true;
  return true;
}

bool NcclWork::check_found_difference() const {
  if (!check_) {
    return false;
  }
  // The end event comes after the copy back, so the slot holds the result.
  int64_t extremes[2];
  std::memcpy(extremes, check_->slot.host(), sizeof(extremes));
  return !hashes_agree(extremes[0], extremes[1]);
}

bool NcclWork::started_on_gpu() const noexcept {
  if (!check_ || !check_->started) {
    return false;
  }
  try {
    return check_->started->query();
  } catch (...) {
    return false;
  }
}

void NcclWork::finish() {
  // See Note [NCCL fingerprint check]: read before anything can count the
  // Work as a success. A failure recorded first wins (an aborted check
  // reads as garbage).
  if (check_found_difference() && !failure_->message()) {
    return; // the watchdog fails it with CollectiveMismatchError
  }
  finish_unchecked();
}

void NcclWork::finish_unchecked() {
  if (!claim()) {
    return;
  }
  // See Note [NCCL failure]: an aborted operation's event completes too.
  if (auto failure = failure_->message()) {
    auto error = aborted_error(name(), *failure);
    if (recorder_) {
      recorder_->failed(record_, error);
    }
    set_error(std::move(error));
    return;
  }
  if (recorder_) {
    recorder_->completed(record_);
  }
  set_result(outputs_);
}

bool NcclWork::end_event_completed_quietly() const noexcept {
  try {
    return end_event_.query();
  } catch (...) {
    return false; // a CUDA error: the watchdog reports it
  }
}

void NcclWork::fail(std::exception_ptr error) {
  if (claim()) {
    if (recorder_) {
      recorder_->failed(record_, error);
    }
    set_error(std::move(error));
  }
}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kUseGroupTimeout && !blocking_wait_) {
    if (!is_completed()) {
      if (check_ && end_event_completed_quietly()) {
        // The check's result is there: read it. A difference leaves the
        // Work to the watchdog, which fails it after looking for the
        // peers' calls (at most kExplainPatience, or the timeout).
        finish();
      } else {
        if (!failure_->message()) {
          c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
          end_event_.block(
              c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream());
        }
        // Before the GPU has run it, so without its check: see "What is
        // left" in Note [NCCL fingerprint check].
        finish_unchecked();
      }
    }
    Work::wait(timeout_); // completed by now (or about to be): returns or rethrows
    return;
  }
  const auto limit = timeout == kUseGroupTimeout ? timeout_ : timeout;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  Backoff backoff;
  while (!is_completed()) {
    if (end_event_.query()) {
      finish();
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      auto message = c10::str(
          name(), ": wait timed out after ", limit.count(),
          " ms; the operation has not completed on the GPU (a peer may be slow, stuck or dead, or "
          "ranks issued collectives in different orders)");
      dump_flight_recorders(message); // Note [Flight recorder], as Work::wait does
      throw TimeoutError(message);
    }
    backoff.pause();
  }
  Work::wait(limit);
}

} // namespace ddp::internal
