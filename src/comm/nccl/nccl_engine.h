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
#include "comm/nccl/nccl_work.h"

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

// Note [NCCL fingerprint check] is in nccl_watchdog.cpp, which runs it.

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
  // Note [Flight recorder]: the collectives, null when off.
  const std::shared_ptr<FlightRecorder> recorder_;

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
