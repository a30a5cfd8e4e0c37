#pragma once

// The engine of the NCCL backend (private header): the communicator, its
// stream, the launch of operations, and the watchdog.
//
// How it works.
//
// Launch. `launch` runs on the caller's thread, under `launch_mutex_`, so
// that operations reach NCCL in issue order, which is the order in which
// they take their sequence numbers. The first launch binds the engine to a
// device and creates the communicator (see `ensure_communicator`). Every
// launch then
//   1. makes the communicator's stream wait for the caller's current stream
//      (`ready_event_`), so that the operation sees every write queued
//      before the call, without blocking the CPU;
//   2. tells the caching allocator that the tensors are in use on the
//      communicator's stream (recordStream), so that their memory is not
//      reused while NCCL still reads or writes it;
//   3. enqueues the NCCL calls between ncclGroupStart and ncclGroupEnd, and
//      any follow-up ATen work (copies, AVG's division) on the stream;
//   4. records the operation's end event and hands an `NcclWork` to the
//      watchdog.
// The communicator is non-blocking (ncclConfig_t.blocking = 0): NCCL calls
// return ncclInProgress instead of blocking, and we poll
// ncclCommGetAsyncError until the call has taken effect, against the
// operation's deadline.
//
// Completion. The watchdog thread polls the end events of the pending Works
// in launch order. A Work whose event has completed completes (the
// watchdog runs its callbacks, with the stream the operation was issued
// from made current). A caller may complete it earlier: `NcclWork::wait()`
// orders the caller's stream after the event and completes it at once.
//
// Failure. See Note [NCCL failure]: the watchdog, or a launch, records the
// first failure in the shared `NcclFailure`, then aborts the communicator;
// every pending Work fails, and so does every later launch.
//
// Fingerprints. With more than one rank, every collective's launch also
// checks that the ranks called the same collective, and the watchdog
// compares the fingerprint of a stalled one through the store: see Note
// [NCCL fingerprint check].

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

namespace ddp::internal {

// Note [NCCL failure]
// After a timeout or an NCCL error, peers may be stuck in a collective that
// can never complete, so the communicator is aborted (ncclCommAbort ends its
// kernels) and the group becomes unusable: the rule of the whole library
// (include/ddp/comm/error.h). The order matters: the failure is recorded
// *before* the abort, because an abort also completes the end events of the
// killed operations, and a Work whose event completes must not then count
// as a success. Whoever completes a Work checks the failure after seeing its
// event complete.

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
};

struct NcclEngineOptions {
  std::chrono::milliseconds timeout{0};
  std::string group_name;
  int device_index = -1;
  bool high_priority_stream = false;
  std::chrono::milliseconds watchdog_interval{100};
};

// Thread-safety: `launch`, `bind_device` and `device` may be called from any
// thread. The watchdog thread is the engine's own; it runs Work callbacks.
class NcclEngine {
 public:
  // `who` is the group's "[rank R/W]" prefix.
  NcclEngine(std::shared_ptr<Store> store, int rank, int size, NcclEngineOptions options,
             std::string who);
  // Lets pending operations finish (each bounded by its deadline), then
  // finalizes and destroys the communicator, or aborts it if that does not
  // finish within kFinalizeTimeout.
  ~NcclEngine();

  NcclEngine(const NcclEngine&) = delete;
  NcclEngine& operator=(const NcclEngine&) = delete;

  // Binds the engine to `requested` (a device index, or -1 for the default
  // choice) unless it is bound already, and returns the bound device.
  // Throws c10::Error, prefixed with `who`, when `requested` is another
  // device than the bound one.
  int bind_device(int requested, const std::string& who);

  // The bound device, or -1.
  int device() const;

  // Until the watchdog has completed or failed every pending Work (each by
  // its deadline).
  void wait_for_pending();

  // Queues `op` and returns its Work. Throws c10::Error for misuse found
  // here (a tensor on another device); communication failures come back as
  // a failed Work.
  std::shared_ptr<Work> launch(NcclOp op);

 private:
  int bind_device_locked(int requested, const std::string& who);
  int default_device() const;
  void ensure_communicator(const std::string& what);
  // Polls until the last non-blocking NCCL call on `comm` has taken effect.
  // `on_poll`, when set, runs at each poll and may throw to give up.
  void wait_until_ready(ncclComm_t comm, std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds timeout, const std::string& what,
                        const std::function<void()>& on_poll = nullptr);
  // Records `error` as the group's failure (See Note [NCCL failure]) and
  // aborts the communicator. Needs launch_mutex_.
  void fail_group_locked(std::exception_ptr error);
  void abort_communicator_locked() noexcept;
  // Finalizes and destroys the communicator, or aborts it. Needs
  // launch_mutex_.
  void release_communicator_locked();
  std::shared_ptr<Work> failed_work(const std::string& name, std::chrono::milliseconds timeout,
                                    std::exception_ptr error);

  void run_watchdog();
  // One pass of the watchdog over `pending`; returns the Works it is done
  // with.
  std::vector<std::shared_ptr<NcclWork>> check_pending(
      const std::vector<std::shared_ptr<NcclWork>>& pending);
  void fail_group_from_watchdog(std::exception_ptr error);

  // See Note [NCCL fingerprint check]. Publishes `fingerprint` and compares
  // it with the other ranks' (non-blocking reads): the mismatch message, or
  // nullopt when none is known (or the store failed).
  std::optional<std::string> compare_fingerprint(const Fingerprint& fingerprint) noexcept;
  // "; rank(s) [1] had not reached allreduce #4" for a checked Work that
  // timed out, or "".
  std::string missing_ranks_clause(const NcclWork& work) noexcept;

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const NcclEngineOptions options_;
  const std::string who_;
  const std::string prefix_; // the group's keys in the store
  const std::shared_ptr<NcclFailure> failure_ = std::make_shared<NcclFailure>();
  // Fingerprints published under prefix_ + "fp/"; null with one rank, which
  // checks nothing (Note [NCCL fingerprint check]).
  const std::unique_ptr<FingerprintExchange> fingerprints_;

  // Serializes launches, communicator creation and abort.
  mutable std::mutex launch_mutex_;
  int device_ = -1; // guarded by launch_mutex_
  ncclComm_t comm_ = nullptr; // guarded by launch_mutex_; null before creation and after abort
  std::optional<c10::cuda::CUDAStream> stream_; // guarded by launch_mutex_
  std::unique_ptr<CudaEvent> ready_event_; // guarded by launch_mutex_
  // The fingerprint checks' memory; made by the first checked launch.
  std::shared_ptr<FingerprintSlots> check_slots_; // guarded by launch_mutex_
  uint64_t next_seq_ = 0; // guarded by launch_mutex_
  uint64_t next_point_to_point_ = 0; // guarded by launch_mutex_
  bool stopping_ = false; // guarded by launch_mutex_
  // Set by the watchdog before it waits for launch_mutex_ to abort: a launch
  // polling NCCL gives up, so that the abort is not delayed by its deadline.
  std::atomic<bool> abort_requested_{false};

  std::mutex pending_mutex_;
  std::condition_variable pending_cv_;
  std::deque<std::shared_ptr<NcclWork>> pending_; // guarded by pending_mutex_; launch order
  bool stop_watchdog_ = false; // guarded by pending_mutex_
  // The stall comparison of Note [NCCL fingerprint check], the watchdog
  // thread's alone: the sequence number of the Work it watches (the oldest
  // unfinished checked one), since when that Work has been seen running on
  // the GPU, and when to compare its fingerprint next.
  struct StallWatch {
    uint64_t seq = 0;
    std::optional<std::chrono::steady_clock::time_point> running_since;
    std::chrono::steady_clock::time_point next_comparison{};
  };
  StallWatch stall_;
  std::thread watchdog_;
};

} // namespace ddp::internal
