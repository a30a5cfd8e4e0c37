#pragma once

// The engine of the MPI backend (private header): a group's communicator,
// its worker and watchdog threads, and point-to-point transfers.
//
// How it works.
//
// Queue. `enqueue` runs on the caller's thread: it takes the next sequence
// number, names the Work ("[rank 1/4] allreduce #12"), records the CUDA
// stream fence and queues a `Task`. The worker thread runs the tasks one at
// a time in queue order, which is issue order, so every rank enters the
// same MPI collectives in the same order on the group's communicator: the
// ProcessGroup contract becomes MPI's own rule for collectives. One worker
// per group, because MPI allows one collective at a time per communicator.
//
// Arrival wait. A task of at least `arrival_wait_min_bytes` first posts
// MPI_Ibarrier and polls it with growing sleeps, then runs its blocking
// collective. MPI's blocking collectives poll on a busy CPU while they wait
// for the last rank; on a machine where the ranks share cores with
// computation (DDP's buckets during backward), the rank that arrives first
// would take CPU time from the rank it waits for. See Note [MPI arrival
// wait].
//
// Deadlines. See Note [MPI deadlines]: the watchdog thread fails a task
// that runs past its deadline with TimeoutError, and the queued and later
// ones with CommError; the task stays blocked inside MPI, so shutting the
// engine down with a task still stuck calls MPI_Abort.
//
// Point to point. `post_point_to_point` posts MPI_Isend or MPI_Irecv at
// once on the caller's thread (send/recv are outside the collective order)
// and returns a Work that completes in `wait`, which polls the request. They
// travel on a communicator of their own, so that no user tag can match the
// messages of the ring allreduce (comm/mpi/mpi_ring.h) on the collectives'
// communicator.

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/work.h>

#include "comm/fingerprint.h"
#include "comm/host_staging.h"
#include "comm/mpi/mpi_runtime.h"
#include "flight_recorder/flight_recorder.h"

namespace ddp::internal::mpi {

// Note [MPI deadlines]
// MPI has no way to cancel a collective, nor to leave a blocking one early.
// So the deadline of a collective cannot stop it; it can only stop the
// waiting. The watchdog looks at the running task at least every
// `watchdog_interval`, and at its deadline. Past it, under the engine's
// mutex, it marks the task timed out and the group broken, takes the queued
// tasks out of the queue, and then, outside the mutex, fails the task's Work
// with TimeoutError and the queued ones with CommError. The worker stays in
// MPI; if the collective ever returns, the worker finds the mark and drops
// its result (whoever marks the task under the mutex first, worker or
// watchdog, completes the Work). The task keeps its tensors alive until MPI
// returns, whatever happened to the Work. Later operations fail at once.
// A group in that state cannot be shut down cleanly: its worker cannot be
// joined and MPI cannot be finalised with it inside MPI, so `shutdown`
// (from the destructor, or the exit handler) calls MPI_Abort, which ends
// every rank of the job. That is also PyTorch's choice for NCCL
// (TORCH_NCCL_ASYNC_ERROR_HANDLING tears the process down).

// Note [MPI arrival wait]
// Waiting for MPI_Ibarrier with sleeps costs one barrier's latency (a few
// microseconds within a node) and up to one sleep step of lateness after the
// last rank arrives, so it is only worth it for collectives that take long
// anyway: `arrival_wait_min_bytes`. Below that, and when all ranks arrive
// together, the spin phase of `poll_request` sees the barrier complete
// before any sleep.

// Note [MPI fingerprint check]
// MPI collectives carry no tag, so the Gloo backend's way of keeping
// mismatched calls apart (Note [Collective fingerprints]) does not apply:
// two ranks that call MPI_Allreduce with different counts meet, and MPI
// truncates, hangs, or sums garbage. So before its collective every task
// runs one more allreduce, of two int64 with MPI_MAX over (h, -h), where h
// is 63 bits of a hash of the task's fingerprint: every rank gets the
// largest and the smallest h at once, and they are equal when every rank
// called the same thing. That allreduce is the same call on every rank
// whatever they called, so it always matches. When they differ, every rank
// gathers every rank's fingerprint (MPI_Allgather of a fixed-size text) and
// raises CollectiveMismatchError naming its own and the first differing
// rank's; no data moved, so the group stays usable. For a task that waits
// for the ranks' arrival anyway (Note [MPI arrival wait]) the check, posted
// as MPI_Iallreduce, is that wait: it costs nothing more. docs/benchmarks.md
// has what it costs a small allreduce.

// Options of an engine; see ProcessGroupMPIOptions for their meaning.
struct EngineOptions {
  std::chrono::milliseconds watchdog_interval{100};
  int64_t arrival_wait_min_bytes = 65536;
};

// A collective's body. Runs on the worker thread with the group's
// communicator; returns the Work's result. Throws CommError when MPI fails.
using CollectiveFn = std::function<std::vector<at::Tensor>(MPI_Comm comm)>;

// Polls `request` with MPI_Test, spinning first and then sleeping for
// growing intervals, until it completes (true) or `deadline` passes (false).
// Throws CommError when MPI reports an error; `what` names the request.
bool poll_request(MPI_Request* request, std::chrono::steady_clock::time_point deadline,
                  const std::string& what);

// Thread-safety: `enqueue` and `post_point_to_point` may be called from any
// thread. The worker thread alone calls collectives on `comm_`.
class MpiEngine final : public MpiExitHook {
 public:
  // Duplicates MPI_COMM_WORLD twice (collectives over every rank), or with
  // `world_ranks` not empty, makes a communicator of those ranks of
  // MPI_COMM_WORLD (MPI_Comm_create_group: a collective of those ranks only)
  // and duplicates it. `who` is the group's "[rank R/W]".
  MpiEngine(std::string who, int size, EngineOptions options, const std::vector<int>& world_ranks);
  // Shuts down (see `shutdown`).
  ~MpiEngine();

  MpiEngine(const MpiEngine&) = delete;
  MpiEngine& operator=(const MpiEngine&) = delete;

  // Queues `run` as the next collective, described by `fingerprint` (its
  // sequence number is set here), whose tensors are `tensors` and whose
  // payload is `bytes` per rank; returns its Work. Before `run`, every rank
  // checks that the fingerprints agree (Note [MPI fingerprint check]).
  std::shared_ptr<Work> enqueue(Fingerprint fingerprint, std::chrono::milliseconds timeout,
                                std::vector<at::Tensor> tensors, int64_t bytes, CollectiveFn run);

  // Posts a send of `tensor` to, or a receive into it from, `peer` at once;
  // `name` names the Work ("[rank 0/2] send to rank 1 tag 7").
  std::shared_ptr<Work> post_point_to_point(bool is_send, const at::Tensor& tensor, int peer,
                                            int tag, std::chrono::milliseconds timeout,
                                            std::string name);

  // Returns once the queue is empty and no task runs, or the running task
  // has timed out (it may never return from MPI).
  void wait_until_idle();

  // The largest tag this MPI accepts (MPI_TAG_UB).
  int max_tag() const {
    return max_tag_;
  }

  void shutdown_at_exit() noexcept override;

 private:
  struct Task {
    std::shared_ptr<Work> work;
    std::chrono::milliseconds timeout{0};
    CollectiveFn run;
    StreamFence fence;
    // Kept until MPI returns, even when the Work has failed before that.
    std::vector<at::Tensor> tensors;
    int64_t bytes = 0;
    Fingerprint fingerprint;
    uint64_t record = 0; // its flight recorder entry
  };

  // The task on the worker, as the watchdog sees it.
  struct Running {
    std::shared_ptr<Work> work;
    std::chrono::milliseconds timeout{0};
    std::chrono::steady_clock::time_point deadline;
    bool timed_out = false; // set by the watchdog; see Note [MPI deadlines]
    uint64_t record = 0;
  };

  void run_worker();
  void run_task(Task& task);
  // See Note [MPI fingerprint check]. Throws CollectiveMismatchError.
  void check_fingerprints(const Task& task);
  void run_watchdog();
  // A Work that has failed because the group is broken.
  std::shared_ptr<Work> failed_work(const std::string& name, std::chrono::milliseconds timeout);
  // Fails a task's Work, its flight recorder entry first; `dump`: write the
  // flight recorder's dump (Note [Flight recorder]), for the failure itself
  // rather than the tasks it leaves unrun.
  void fail(const std::shared_ptr<Work>& work, uint64_t record, std::exception_ptr error, bool dump);
  // Lets queued work finish, each task within its deadline, then stops the
  // threads and frees the communicator; calls MPI_Abort instead when a task
  // that timed out is still inside MPI. Idempotent; never throws.
  void shutdown() noexcept;

  const std::string who_;
  const int size_;
  const EngineOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;     // collectives; the worker thread's alone
  MPI_Comm p2p_comm_ = MPI_COMM_NULL; // send/recv
  std::shared_ptr<FlightRecorder> recorder_; // null when off
  int max_tag_ = 32767;

  std::mutex mutex_;
  std::condition_variable queue_cv_;    // the worker waits for tasks
  std::condition_variable watchdog_cv_; // the watchdog waits for its next look, or stop
  std::condition_variable state_cv_;    // a task ended, timed out, or the worker exited
  std::deque<Task> queue_;              // guarded by mutex_
  uint64_t next_seq_ = 0;               // guarded by mutex_
  bool stop_ = false;                   // guarded by mutex_
  bool stop_watchdog_ = false;          // guarded by mutex_
  bool worker_exited_ = false;          // guarded by mutex_
  std::optional<Running> running_;      // guarded by mutex_
  std::string broken_message_;          // guarded by mutex_; empty while healthy

  std::mutex shutdown_mutex_;
  bool shut_down_ = false; // guarded by shutdown_mutex_

  std::thread worker_;
  std::thread watchdog_;
};

} // namespace ddp::internal::mpi
