#include "comm/mpi/mpi_engine.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <utility>

#include <ddp/comm/error.h>

#include "comm/mpi/mpi_types.h"
#include "comm/point_to_point_work.h"
#include "comm/recorder_outputs.h"
#include "internal/check.h"

namespace ddp::internal::mpi {

namespace {

using Clock = std::chrono::steady_clock;

// poll_request spins this long before it starts to sleep: long enough for a
// peer that arrives at about the same time, short enough not to matter to a
// CPU that a late peer needs.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kMaxSleep = std::chrono::microseconds(1000);

// How long past an operation's deadline a plain wait() waits for the
// watchdog's verdict.
constexpr auto kWaitMargin = std::chrono::milliseconds(1000);

// Shutdown looks at the worker this often while it waits for it.
constexpr auto kShutdownPoll = std::chrono::milliseconds(10);

std::string not_run_message(const std::string& name, const std::string& broken) {
  return c10::str(name, ": not run, because the process group failed earlier and is unusable: ",
                  broken,
                  ". Destroy the group (with MPI this ends the job: a collective is stuck inside "
                  "MPI; see docs/errors.md).");
}

// send/recv: the request posted at issue, completed in `wait` (the shared
// part: comm/point_to_point_work.h).
class MpiPointToPointWork : public PointToPointWork {
 public:
  MpiPointToPointWork(std::string name, std::chrono::milliseconds default_timeout, bool is_send,
                      at::Tensor tensor, at::Tensor host, MPI_Request request)
      : PointToPointWork(std::move(name), default_timeout, is_send, std::move(tensor),
                         std::move(host)),
        request_(request) {}

  ~MpiPointToPointWork() override { release_transfer(); }

 private:
  void wait_for_transfer(std::chrono::milliseconds timeout) override {
    if (mpi_finalized()) {
      throw CommError(c10::str(name(), ": MPI was finalised before the transfer completed"));
    }
    if (!poll_request(&request_, Clock::now() + timeout, name())) {
      throw TimeoutError(c10::str(name(), " timed out after ", timeout.count(),
                                  " ms: the peer has not ", is_send() ? "received it" : "sent it",
                                  " (it may be slow, stuck or dead, or use another tag)"));
    }
  }

  void abandon_transfer() override {
    if (request_ != MPI_REQUEST_NULL && !mpi_finalized()) {
      // Nobody waited, or the wait timed out. A receive that has not matched
      // yet can be cancelled; MPI cannot take back a send. Either way the
      // buffers stay alive until MPI is done with them.
      if (!is_send()) {
        MPI_Cancel(&request_);
      }
      adopt_request(request_, {tensor(), host()});
    }
  }

  MPI_Request request_; // guarded by the transfer lock; MPI_REQUEST_NULL once complete
};

} // namespace

bool poll_request(MPI_Request* request, Clock::time_point deadline, const std::string& what) {
  const auto start = Clock::now();
  auto sleep = std::chrono::duration_cast<Clock::duration>(kFirstSleep);
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (done) {
      return true;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return false;
    }
    if (now - start < kSpin) {
      continue;
    }
    std::this_thread::sleep_for(std::min(sleep, deadline - now));
    sleep = std::min(sleep * 2, std::chrono::duration_cast<Clock::duration>(kMaxSleep));
  }
}

MpiEngine::MpiEngine(std::string who, int size, EngineOptions options,
                     const std::vector<int>& world_ranks)
    : who_(std::move(who)), size_(size), options_(options) {
  if (world_ranks.empty()) {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), who_ + " ProcessGroupMPI: MPI_Comm_dup");
  } else {
    // Ranks sorted ascending: the new communicator's rank r is world rank
    // world_ranks[r], the group rank ddp gives it.
    MPI_Group world_group;
    MPI_Group sub_group;
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), who_ + " ProcessGroupMPI: MPI_Comm_group");
    check_mpi(MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()), world_ranks.data(),
                             &sub_group),
              who_ + " ProcessGroupMPI: MPI_Group_incl");
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, sub_group, /*tag=*/0, &comm_);
    MPI_Group_free(&sub_group);
    MPI_Group_free(&world_group);
    check_mpi(rc, who_ + " ProcessGroupMPI: MPI_Comm_create_group");
  }
  check_mpi(MPI_Comm_dup(comm_, &p2p_comm_), who_ + " ProcessGroupMPI: MPI_Comm_dup");
  // Errors come back as codes, which become CommErrors naming the operation,
  // instead of MPI's default of ending the job on the spot.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(p2p_comm_, MPI_ERRORS_RETURN);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr) {
    max_tag_ = *tag_ub;
  }
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  recorder_ = make_flight_recorder(world_ranks.empty() ? "default" : c10::str("ranks ", world_ranks), "mpi",
                                   rank, size_);
  worker_ = std::thread([this] { run_worker(); });
  watchdog_ = std::thread([this] { run_watchdog(); });
  register_exit_hook(this);
}

MpiEngine::~MpiEngine() {
  shutdown();
  unregister_exit_hook(this);
}

void MpiEngine::shutdown_at_exit() noexcept {
  shutdown();
}

std::shared_ptr<Work> MpiEngine::failed_work(const std::string& name,
                                             std::chrono::milliseconds timeout) {
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    broken = broken_message_;
  }
  auto work = Work::create(name, timeout);
  work->set_error(std::make_exception_ptr(CommError(not_run_message(name, broken))));
  return work;
}

std::shared_ptr<Work> MpiEngine::enqueue(Fingerprint fingerprint, std::chrono::milliseconds timeout,
                                         std::vector<at::Tensor> tensors, int64_t bytes,
                                         CollectiveFn run) {
  auto fence = StreamFence::record(tensors); // See host_staging.h
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string& op_name = fingerprint.op;
  DDP_CHECK(!stop_, who_, " ", op_name, ": the process group is being destroyed");
  const uint64_t seq = next_seq_++;
  fingerprint.seq = seq;
  // A plain wait() must report the watchdog's TimeoutError, which says what
  // the group has become, not give up on its own first: it waits until a
  // while after the operation's deadline, which the watchdog enforces from
  // the moment the task starts (see Note [MPI deadlines]).
  const auto wait_timeout = timeout + options_.watchdog_interval + kWaitMargin;
  auto work = Work::create(c10::str(who_, " ", op_name, " #", seq), wait_timeout);
  const uint64_t record = recorder_ ? recorder_->queued(fingerprint) : 0;
  if (!broken_message_.empty()) {
    const std::string broken = broken_message_;
    lock.unlock();
    fail(work, record, std::make_exception_ptr(CommError(not_run_message(work->name(), broken))), false);
    return work;
  }
  work->keep_alive(tensors);
  queue_.push_back(Task{work, timeout, std::move(run), std::move(fence), std::move(tensors), bytes,
                        std::move(fingerprint), record});
  lock.unlock();
  queue_cv_.notify_one();
  return work;
}

std::shared_ptr<Work> MpiEngine::post_point_to_point(bool is_send, const at::Tensor& tensor,
                                                     int peer, int tag,
                                                     std::chrono::milliseconds timeout,
                                                     std::string name) {
  bool broken = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!stop_, name, ": the process group is being destroyed");
    broken = !broken_message_.empty();
  }
  if (broken) {
    return failed_work(name, timeout);
  }
  at::Tensor host = PointToPointWork::host_buffer(tensor, is_send, name);
  MPI_Request request = MPI_REQUEST_NULL;
  const int count = static_cast<int>(tensor.numel()); // checked by the caller
  const MPI_Datatype datatype = datatype_of(tensor.scalar_type());
  const int rc = is_send ? MPI_Isend(host.data_ptr(), count, datatype, peer, tag, p2p_comm_, &request)
                         : MPI_Irecv(host.data_ptr(), count, datatype, peer, tag, p2p_comm_, &request);
  if (rc != MPI_SUCCESS) {
    auto work = Work::create(name, timeout);
    work->set_error(std::make_exception_ptr(CommError(c10::str(
        name, ": ", is_send ? "MPI_Isend" : "MPI_Irecv", " failed: ", error_string(rc)))));
    return work;
  }
  return std::make_shared<MpiPointToPointWork>(std::move(name), timeout, is_send, tensor,
                                               std::move(host), request);
}

void MpiEngine::run_worker() {
  for (;;) {
    Task task;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        break; // stop_, and nothing left to finish
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_message_;
      if (broken.empty()) {
        running_ = Running{task.work, task.timeout, Clock::now() + task.timeout, false, task.record};
      }
    }
    if (broken.empty()) {
      if (recorder_) {
        recorder_->started(task.record);
      }
      run_task(task);
    } else {
      fail(task.work, task.record,
           std::make_exception_ptr(CommError(not_run_message(task.work->name(), broken))), false);
    }
    state_cv_.notify_all(); // for wait_until_idle; no system call without a waiter
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    worker_exited_ = true;
  }
  state_cv_.notify_all();
}

void MpiEngine::wait_until_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  state_cv_.wait(lock, [this] {
    return worker_exited_ || (queue_.empty() && !running_) || (running_ && running_->timed_out);
  });
}

void MpiEngine::run_task(Task& task) {
  const std::string& name = task.work->name();
  std::vector<at::Tensor> result;
  std::exception_ptr error;
  bool group_failed = false;
  try {
    task.fence.wait();
    check_fingerprints(task);
    result = task.run(comm_);
  } catch (const CollectiveMismatchError&) {
    error = std::current_exception(); // every rank raised it, before any data moved
  } catch (const CommError& e) {
    // MPI failed ("MPI_Allreduce: <MPI's text>"): name the operation.
    error = std::make_exception_ptr(CommError(c10::str(name, ": ", e.what())));
    group_failed = true;
  } catch (const c10::Error&) {
    error = std::current_exception(); // misuse caught late; the ranks did not enter MPI
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(CommError(c10::str(name, ": ", error_message(e))));
    group_failed = true;
  }
  bool timed_out = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timed_out = running_->timed_out;
    running_.reset();
    if (group_failed && !timed_out && broken_message_.empty()) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        broken_message_ = error_message(e);
      }
    }
  }
  if (timed_out) {
    return; // the watchdog failed the Work; see Note [MPI deadlines]
  }
  if (error) {
    fail(task.work, task.record, error, true);
  } else {
    if (recorder_) {
      recorder_->completed(task.record);
    }
    task.work->set_result(std::move(result));
  }
}

void MpiEngine::fail(const std::shared_ptr<Work>& work, uint64_t record, std::exception_ptr error, bool dump) {
  if (recorder_) {
    recorder_->failed(record, error, dump);
  }
  work->set_error(std::move(error));
}

void MpiEngine::check_fingerprints(const Task& task) {
  if (size_ < 2) {
    return;
  }
  // (h, -h) reduced with MAX: (largest h, -smallest h).
  const int64_t hash = task.fingerprint.hash63();
  int64_t extremes[2] = {hash, -hash};
  if (options_.arrival_wait_min_bytes >= 0 && task.bytes >= options_.arrival_wait_min_bytes) {
    // See Note [MPI arrival wait]: the check is the wait.
    MPI_Request arrival = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, extremes, 2, MPI_INT64_T, MPI_MAX, comm_, &arrival),
              "MPI_Iallreduce (fingerprint check)");
    poll_request(&arrival, Clock::time_point::max(), "MPI_Iallreduce (fingerprint check)");
  } else {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT64_T, MPI_MAX, comm_),
              "MPI_Allreduce (fingerprint check)");
  }
  if (extremes[0] == -extremes[1]) {
    return;
  }
  // Some rank called something else: every rank is here, so gather the
  // fingerprints themselves to name them.
  constexpr size_t kKeyBytes = 256;
  std::vector<char> mine(kKeyBytes, '\0');
  const std::string key = task.fingerprint.key();
  std::copy_n(key.begin(), std::min(key.size(), kKeyBytes - 1), mine.begin());
  std::vector<char> all(kKeyBytes * static_cast<size_t>(size_), '\0');
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(kKeyBytes), MPI_CHAR, all.data(),
                          static_cast<int>(kKeyBytes), MPI_CHAR, comm_),
            "MPI_Allgather (fingerprint check)");
  for (int r = 0; r < size_; ++r) {
    const std::string theirs(all.data() + static_cast<size_t>(r) * kKeyBytes);
    if (theirs != std::string(mine.data())) {
      throw CollectiveMismatchError(
          c10::str(task.work->name(), ": ", mismatch_message(task.fingerprint, r, theirs)));
    }
  }
  // Equal texts but different hashes cannot happen; fail safe all the same.
  throw CollectiveMismatchError(c10::str(task.work->name(), ": the ranks' fingerprints differ (",
                                         task.fingerprint.describe(), " on this rank)"));
}

void MpiEngine::run_watchdog() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_watchdog_) {
    const auto now = Clock::now();
    if (running_ && !running_->timed_out && now >= running_->deadline) {
      // See Note [MPI deadlines].
      running_->timed_out = true;
      auto work = running_->work;
      const uint64_t record = running_->record;
      const std::string message = c10::str(
          work->name(), " timed out after ", running_->timeout.count(),
          " ms: it is still blocked inside MPI, waiting for a peer (a rank may be stuck, dead, "
          "or issuing collectives in a different order). MPI cannot cancel a collective, so the "
          "group is unusable; destroying it, or exiting, ends the job with MPI_Abort.");
      if (broken_message_.empty()) {
        broken_message_ = message;
      }
      std::deque<Task> queued;
      queued.swap(queue_);
      const std::string broken = broken_message_;
      lock.unlock();
      for (auto& task : queued) {
        fail(task.work, task.record,
             std::make_exception_ptr(CommError(not_run_message(task.work->name(), broken))), false);
      }
      fail(work, record, std::make_exception_ptr(TimeoutError(message)), true);
      state_cv_.notify_all();
      lock.lock();
      continue;
    }
    auto wake = now + options_.watchdog_interval;
    if (running_ && !running_->timed_out) {
      wake = std::min(wake, running_->deadline);
    }
    watchdog_cv_.wait_until(lock, wake);
  }
}

void MpiEngine::shutdown() noexcept {
  std::lock_guard<std::mutex> once(shutdown_mutex_);
  if (shut_down_) {
    return;
  }
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  {
    // The worker finishes the queue: each task within its deadline, which
    // the watchdog enforces meanwhile.
    std::unique_lock<std::mutex> lock(mutex_);
    while (!worker_exited_) {
      if (running_ && running_->timed_out) {
        const std::string name = running_->work->name();
        lock.unlock();
        abort_job(c10::str(name,
                           " timed out and is still blocked inside MPI, which cannot cancel it; "
                           "ending the job with MPI_Abort so that no rank waits forever (see "
                           "docs/errors.md)"));
      }
      state_cv_.wait_for(lock, kShutdownPoll);
    }
  }
  worker_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_watchdog_ = true;
  }
  watchdog_cv_.notify_all();
  watchdog_.join();
  if (!mpi_finalized()) {
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&p2p_comm_);
  }
}

} // namespace ddp::internal::mpi
