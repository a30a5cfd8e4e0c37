#pragma once

// The NCCL engine's operations (private header): what a launch describes
// (NcclOp), its fingerprint check (NcclCheck), its Work (NcclWork), and the
// group's first failure that Works report (NcclFailure). nccl_engine.h
// tells how they are launched and completed; nccl_work.cpp implements them.

#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ddp/store/store.h>
#include <ddp/comm/work.h>

#include "comm/fingerprint.h"
#include "comm/nccl/nccl_support.h"
#include "flight_recorder/flight_recorder.h"

namespace ddp::internal {

class NcclEngine;

// The first failure of a group, shared by the engine and its Works so that a
// Work can report it even after its group is gone.
//
// Thread-safety: all methods may be called from any thread.
class NcclFailure {
 public:
  // Records `error` (whose text is `message`) unless a failure was recorded
  // before; returns whether this call recorded it.
  bool record(std::exception_ptr error, std::string message);
  // The text of the first failure, or nullopt.
  std::optional<std::string> message() const;

 private:
  mutable std::mutex mutex_;
  std::exception_ptr error_; // guarded by mutex_
  std::string message_; // guarded by mutex_
};

// What one operation does on the communicator's stream.
struct NcclOp {
  // The collective's name as in torch.distributed ("allreduce").
  std::string op_name;
  // For point-to-point transfers: "to rank 1 (tag 0)". Empty for collectives.
  std::string peer_detail;
  // Collectives take the next sequence number; send/recv do not (they are
  // outside the collective order, so numbers would differ across ranks).
  bool collective = true;
  // What this rank calls, for the check of Note [NCCL fingerprint check]:
  // built as the other backends build it for the same collective; its
  // sequence number is set by the launch. Unused for send/recv.
  Fingerprint fingerprint;
  // The tensors' device, or -1 when the operation has none.
  int device = -1;
  std::chrono::milliseconds timeout{0};
  // Every tensor the GPU reads or writes: kept alive until the Work
  // completes, and recorded on the communicator's stream.
  std::vector<at::Tensor> tensors;
  // The Work's result.
  std::vector<at::Tensor> outputs;
  // A barrier: `wait()` blocks the CPU.
  bool blocking_wait = false;
  // Enqueues the NCCL calls (inside ncclGroupStart/End) and raw CUDA copies
  // on `stream`. `what` prefixes error messages ("[rank 0/2] allreduce #3").
  std::function<void(ncclComm_t comm, cudaStream_t stream, const std::string& what)> issue;
  // ATen work to queue after the NCCL calls, with the communicator's stream
  // current (for example AVG's division). May be empty.
  std::function<void()> finish;
};

// The fingerprint check of one collective (Note [NCCL fingerprint check]).
// Filled in by the launch, read-only once its Work exists.
struct NcclCheck {
  Fingerprint fingerprint; // its sequence number is the Work's
  FingerprintSlots::Lease slot; // where (largest h, -smallest h) lands
  // Recorded on the communicator's stream before the operation, after its
  // wait for the caller's stream: complete once the operation has started
  // on the GPU, which is when a stall can begin.
  std::unique_ptr<CudaEvent> started;
};

// The Work of one NCCL operation. See the narrative above for its two ways
// to complete.
//
// Thread-safety: as Work; `finish` and `fail` complete it at most once even
// when the caller and the watchdog race.
class NcclWork : public Work {
 public:
  // Takes `op`'s timeout, outputs (moved out) and blocking_wait. `device` is
  // the operation's device and `issuing_stream` the caller's current stream
  // when it was issued. `check` is the operation's fingerprint check, or
  // null when it has none (one rank, send/recv).
  NcclWork(std::string name, NcclOp& op, int device, c10::cuda::CUDAStream issuing_stream,
           std::shared_ptr<NcclFailure> failure, std::unique_ptr<NcclCheck> check = nullptr);

  // Without a timeout: orders the caller's current stream after the
  // operation and returns (or, for a blocking-wait Work such as a barrier,
  // behaves as with the operation's timeout). With a timeout: blocks until
  // the GPU has finished the operation; throws TimeoutError once `timeout`
  // has passed.
  void wait(std::chrono::milliseconds timeout = kUseGroupTimeout) override;

  // Called once the end event has completed. Completes the Work with its
  // outputs, unless a failure was recorded, in which case it fails, or its
  // fingerprint check found a difference, in which case it leaves the Work
  // to the watchdog (which fails it with CollectiveMismatchError). No-op
  // once completed.
  void finish();
  // Fails the Work with `error`. No-op once completed.
  void fail(std::exception_ptr error);

  // Its flight recorder entry, completed or failed with it (Note [Flight
  // recorder]). Set once, before the watchdog can see the Work.
  void set_flight_record(std::shared_ptr<FlightRecorder> recorder, uint64_t record) {
    recorder_ = std::move(recorder);
    record_ = record;
  }

  // The checked collective's fingerprint, or null when it has no check.
  const Fingerprint* fingerprint() const {
    return check_ ? &check_->fingerprint : nullptr;
  }
  // Whether the fingerprint check found that the ranks' calls differ. Only
  // meaningful once the end event has completed; false without a check.
  bool check_found_difference() const;
  // Whether the checked operation has started on the GPU (false without a
  // check, or on a CUDA error, which the end event reports).
  bool started_on_gpu() const noexcept;

  // The event recorded after the operation on the communicator's stream.
  CudaEvent& end_event() {
    return end_event_;
  }
  std::chrono::steady_clock::time_point deadline() const {
    return deadline_;
  }
  std::chrono::milliseconds timeout() const {
    return timeout_;
  }
  // The stream that was current when the operation was issued.
  const c10::cuda::CUDAStream& issuing_stream() const {
    return issuing_stream_;
  }

 private:
  // Claims the right to complete the Work; true for the first caller only.
  bool claim();
  // `finish` without looking at the fingerprint check: for a non-blocking
  // wait(), which completes the Work before the GPU has run it.
  void finish_unchecked();
  // end_event_.query(), false on a CUDA error (which the watchdog reports).
  bool end_event_completed_quietly() const noexcept;

  const std::chrono::milliseconds timeout_;
  const std::chrono::steady_clock::time_point deadline_;
  const int device_;
  const c10::cuda::CUDAStream issuing_stream_;
  const std::shared_ptr<NcclFailure> failure_;
  const std::vector<at::Tensor> outputs_;
  const bool blocking_wait_;
  // Holds its slot until the Work is destroyed (see FingerprintSlots).
  const std::unique_ptr<NcclCheck> check_;
  CudaEvent end_event_;
  std::mutex claim_mutex_;
  bool claimed_ = false; // guarded by claim_mutex_
  std::shared_ptr<FlightRecorder> recorder_; // null: not recorded
  uint64_t record_ = 0;
};

} // namespace ddp::internal
