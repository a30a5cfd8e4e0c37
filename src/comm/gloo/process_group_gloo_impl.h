#pragma once

// ProcessGroupGloo::Impl (private header, included by process_group_gloo.cpp
// alone): the task queue, the worker threads that run it and the monitor
// thread of Note [Collective fingerprints], with the conversion of Gloo's
// failures into ddp's errors. The collectives that fill the queue are in
// process_group_gloo.cpp, whose opening comment tells how the two work
// together; the sparse allreduce is in gloo_sparse.cpp, send/recv in
// gloo_point_to_point.cpp.

#include <ddp/comm/process_group_gloo.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <ddp/comm/error.h>

#include "comm/failure_ledger.h"
#include "comm/fingerprint.h"
#include "comm/contiguous_arguments.h"
#include "comm/gloo/gloo_api.h"
#include "comm/gloo/gloo_errors.h"
#include "comm/gloo/gloo_rendezvous.h"
#include "comm/rendezvous_arrival.h"
#include "comm/gloo/gloo_shared_buffers.h"
#include "comm/gloo/gloo_words.h"
#include "comm/gloo/sigpipe_guard.h"
#include "comm/gloo/silent_peers.h"
#include "comm/host_staging.h"
#include "comm/recorder_outputs.h"
#include "flight_recorder/flight_recorder.h"
#include "internal/check.h"
#include "internal/env.h"

namespace ddp {

namespace internal {

// ProcessGroupGlooOptions::shared_memory_min_bytes, or -1 when DDP_GLOO_SHM
// turns buffers in shared memory off.
inline int64_t shared_memory_wanted(const ProcessGroupGlooOptions& options) {
  const std::string value = env_get(kEnvGlooShm).value_or("1");
  DDP_CHECK(value == "0" || value == "1", "ProcessGroupGloo: DDP_GLOO_SHM must be 0 or 1 (got '", value,
            "'): 1 reduces large buffers in shared memory when the ranks share a host, 0 never does");
  const std::string cross = env_get(kEnvCrossMemory).value_or("1");
  DDP_CHECK(cross == "0" || cross == "1", "ProcessGroupGloo: DDP_CROSS_MEMORY must be 0 or 1 (got '", cross,
            "'): 1 lets DDP's allreduce read the peers' gradients where they lie when the ranks share a host, "
            "0 copies them through the buckets");
  return value == "0" ? -1 : options.shared_memory_min_bytes();
}

} // namespace internal

// Everything that touches Gloo. See the narrative at the top of the file.
//
// Thread-safety: `enqueue` may be called from any thread; the worker threads
// alone run tasks and touch `context_` for collectives; the monitor thread
// reads the running tasks under `mutex_` and talks to the store (Note
// [Collective fingerprints]).
class DDP_GLOO_HIDDEN ProcessGroupGloo::Impl {
 public:
  struct Task {
    std::shared_ptr<Work> work;
    std::chrono::milliseconds timeout;
    // Given the task's Gloo tag, deadline and Work name.
    std::function<std::vector<at::Tensor>(uint32_t tag, std::chrono::milliseconds timeout,
                                          const std::string& name)>
        run;
    internal::Fingerprint fingerprint; // its seq is the task's; see Note [Collective fingerprints]
    internal::StreamFence fence; // See Note [Gloo and CUDA streams] in comm/host_staging.h
    // See Note [Two Gloo tasks at once].
    std::vector<const void*> storages;
    bool exclusive = false;
    uint64_t record = 0; // its flight recorder entry
  };

  Impl(ProcessGroupGloo& group, std::shared_ptr<Store> store,
       const ProcessGroupGlooOptions& options)
      : group_(group),
        store_(std::move(store)),
        shared_(group.rank_prefix(), "ProcessGroupGloo", group.rank(), group.size()),
        shared_wanted_(internal::shared_memory_wanted(options)) {
    // The rendezvous writes to Gloo's sockets from this thread, and every
    // thread started here (Gloo's event loop, the workers, the monitor)
    // begins life with this thread's signal mask, so SIGPIPE is blocked in
    // them from their first instruction: See Note [SIGPIPE and Gloo].
    internal::SigpipeGuard guard;
    connect(options);
    recorder_ = internal::make_flight_recorder(options.group_name(), "gloo", group_.rank(), group_.size());
    for (int i = 0; i < kWorkerThreads; ++i) {
      workers_.emplace_back([this] { run_worker(); });
    }
    monitor_ = std::thread([this] { run_monitor(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    queue_cv_.notify_all();
    monitor_cv_.notify_all();
    for (auto& worker : workers_) {
      worker.join();
    }
    monitor_.join();
  }

  std::string who() const {
    return group_.rank_prefix();
  }

  // Queues `run` as the next collective; returns its Work. `fingerprint`
  // describes this rank's call (all but its sequence number, which is set
  // here); see Note [Collective fingerprints].
  std::shared_ptr<Work> enqueue(
      internal::Fingerprint fingerprint,
      std::chrono::milliseconds timeout,
      std::vector<at::Tensor> keep,
      std::function<std::vector<at::Tensor>(uint32_t, std::chrono::milliseconds)> run) {
    return enqueue_named(std::move(fingerprint), timeout, std::move(keep),
                         [run = std::move(run)](uint32_t tag, std::chrono::milliseconds timeout,
                                                const std::string&) { return run(tag, timeout); });
  }

  // enqueue, for a task that also needs its Work's name.
  std::shared_ptr<Work> enqueue_named(
      internal::Fingerprint fingerprint,
      std::chrono::milliseconds timeout,
      std::vector<at::Tensor> keep,
      std::function<std::vector<at::Tensor>(uint32_t, std::chrono::milliseconds, const std::string&)> run) {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!stop_, who(), " ", fingerprint.op, ": the process group is being destroyed");
    fingerprint.seq = next_seq_++;
    auto work = Work::create(c10::str(who(), " ", fingerprint.op, " #", fingerprint.seq), timeout);
    const uint64_t record = recorder_ ? recorder_->queued(fingerprint) : 0;
    Task task{work,  timeout, std::move(run), std::move(fingerprint),
              internal::StreamFence::record(keep), {}, false, record};
    for (const auto& t : keep) {
      if (t.defined() && t.is_sparse()) {
        // A sparse tensor has no storage of its own, and a sparse allreduce
        // replaces its indices and values: the tensor itself is the unit.
        task.storages.push_back(t.unsafeGetTensorImpl());
        task.storages.push_back(t._indices().storage().unsafeGetStorageImpl());
        task.storages.push_back(t._values().storage().unsafeGetStorageImpl());
      } else if (t.defined() && t.has_storage()) {
        task.storages.push_back(t.storage().unsafeGetStorageImpl());
      }
    }
    task.exclusive = keep.empty(); // a barrier
    work->keep_alive(std::move(keep));
    queue_.push_back(std::move(task));
    queue_cv_.notify_one();
    return work;
  }

  // Queues a Gloo algorithm that reads all of `input` and writes all of
  // `output` (allgather into one tensor, alltoall); `args` made them
  // contiguous (Note [Non-contiguous arguments]).
  // `algorithm` is the Gloo function (its options are const in some Gloo
  // versions and not in others).
  template <typename GlooOptions, typename Algorithm>
  std::shared_ptr<Work> enqueue_input_output(const char* op_name, std::chrono::milliseconds timeout,
                                             const at::Tensor& output, const at::Tensor& input,
                                             const internal::ContiguousArguments& args,
                                             Algorithm algorithm) {
    auto context = context_;
    internal::Fingerprint fingerprint{op_name, input.scalar_type(), input.numel()};
    return enqueue(std::move(fingerprint), timeout, args.keep({output, input}),
                   args.wrap([output, input, context, algorithm](uint32_t tag, std::chrono::milliseconds timeout) {
                     internal::HostStaging staging;
                     auto host_input = staging.in(input);
                     auto host_output = staging.in(output);
                     if (input.numel() > 0) {
                       GlooOptions o(context);
                       internal::set_input(o, host_input);
                       internal::set_output(o, host_output);
                       o.setTag(tag);
                       o.setTimeout(timeout);
                       algorithm(o);
                     }
                     staging.copy_back();
                     return std::vector<at::Tensor>{output};
                   }));
  }

  std::shared_ptr<gloo::Context> context() const {
    return context_;
  }

  // The buffers in shared memory (Note [Shared buffers]); allocated and
  // reduced by the workers, in tasks. Outlives every task.
  internal::shm::SharedBuffers* shared() {
    return &shared_;
  }
  // Whether this rank offers buffers in shared memory of `bytes` bytes.
  bool shared_wanted(int64_t bytes) const {
    return shared_wanted_ >= 0 && bytes >= shared_wanted_;
  }

  // Until the queue is empty and no task runs. Each task ends by its
  // deadline, so this does too.
  void wait_until_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    queue_cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  }

  // Posts a send or receive at once; see internal::PointToPointWork.
  std::shared_ptr<Work> start_point_to_point(bool is_send, const at::Tensor& tensor, int peer,
                                             const PointToPointOptions& options,
                                             std::chrono::milliseconds timeout,
                                             const std::string& who);

  std::shared_ptr<Store> store() const {
    return store_;
  }

 private:
  void connect(const ProcessGroupGlooOptions& options) {
    // Groups are numbered per (name, rank) in creation order, the same on
    // every rank, so that a group created again with the same name and store
    // does not meet the keys of its predecessor. The rank is part of the key
    // because tests run several ranks as threads of one process.
    static std::mutex generation_mutex;
    static std::map<std::pair<std::string, int>, int> generations;
    int generation;
    {
      std::lock_guard<std::mutex> lock(generation_mutex);
      generation = generations[{options.group_name(), group_.rank()}]++;
    }
    const std::string prefix =
        c10::str("ddp/", options.group_name(), "/", generation, "/");
    const auto timeout = group_.timeout();
    internal::wait_for_all_ranks(*store_, prefix, group_.rank(), group_.size(), timeout, who());
    internal::init_exit_point("arrived", group_.rank()); // Note [Start-up exit points]

    const auto choice = internal::choose_device(options.interface(), options.hostname(),
                                                options.master_addr(), group_.size());
    auto device = internal::make_gloo_device(choice, who());
    auto context = std::make_shared<gloo::rendezvous::Context>(group_.rank(), group_.size());
    context->setTimeout(timeout);
    internal::GlooStoreAdapter adapter(store_, prefix + "gloo/", timeout);
    try {
      rendezvous_step("Gloo's rendezvous (every rank publishes the addresses of its pairs)",
                      [&] { context->connectFullMesh(adapter, device); });
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw IoError(c10::str(who(), " init_process_group: Gloo could not connect to the other ranks (bound to ",
                             choice.interface.empty() ? choice.hostname : choice.interface,
                             ", chosen from ", choice.reason, "): ", error_message(e)));
    }
    context_ = std::move(context);
    internal::init_exit_point("gloo-connected", group_.rank());
    // Nobody leaves rendezvous before everyone is connected: a rank that
    // destroyed its group at once would otherwise close connections a slower
    // peer is still setting up (PyTorch's store-based barrier does the same).
    rendezvous_step("the last step of Gloo's rendezvous (every rank lists its connections)", [&] {
      peer_addresses_ = internal::exchange_peer_addresses(*context_, *store_, prefix, group_.rank(),
                                                          group_.size(), timeout);
    });
    internal::init_exit_point("addresses", group_.rank());
    silent_peers_ = std::make_unique<internal::SilentPeers>(peer_addresses_);
    fingerprints_ = std::make_shared<internal::FingerprintExchange>(store_, prefix + "fp/", group_.rank(),
                                                                   group_.size());
    failures_ = std::make_shared<internal::FailureLedger>(store_, prefix + "first_failure");
  }

  // Runs `step` of the rendezvous, named `name`; the store's errors in it
  // (which name the store, not the rank) come out naming this rank and the
  // step, as a TimeoutError when a rank did not get there in time, else an
  // IoError (the store's server, rank 0, is gone).
  template <typename Step>
  void rendezvous_step(const char* name, Step step) {
    try {
      step();
    } catch (const TimeoutError& e) {
      throw TimeoutError(c10::str(who(), " init_process_group: ", name,
                                  " did not complete: a rank stopped or is slow. The store said: ",
                                  e.what()));
    } catch (const CommError& e) {
      throw IoError(c10::str(who(), " init_process_group: ", name,
                             " lost the store: rank 0, which serves it, probably stopped. The "
                             "store said: ", e.what()));
    }
  }

  // The rank whose address `what` (a Gloo error message) names, or -1. With
  // two ranks it can only be the other one.
  int peer_of(const std::string& what) const {
    if (group_.size() == 2) {
      return 1 - group_.rank();
    }
    // The longest match: "[10.0.0.1]:4000" is also in "[10.0.0.1]:40001".
    int peer = -1;
    size_t longest = 0;
    for (const auto& [address, rank] : peer_addresses_) {
      if (address.size() > longest && what.find(address) != std::string::npos) {
        peer = rank;
        longest = address.size();
      }
    }
    return peer;
  }

  void run_worker() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // Tasks start in queue order, whichever worker runs them; see
        // can_start_locked for when two run at once.
        queue_cv_.wait(lock, [this] {
          return (stop_ && queue_.empty()) || (!queue_.empty() && can_start_locked(queue_.front()));
        });
        if (queue_.empty()) {
          return; // stop_ and nothing left to finish
        }
        task = std::move(queue_.front());
        queue_.pop_front();
        running_tasks_.push_back({task.fingerprint, std::chrono::steady_clock::now()});
        ++running_;
        running_exclusive_ = running_exclusive_ || task.exclusive;
        running_storages_.insert(running_storages_.end(), task.storages.begin(), task.storages.end());
      }
      if (recorder_) {
        recorder_->started(task.record);
      }
      run_task(task);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --running_;
        running_tasks_.erase(std::find_if(running_tasks_.begin(), running_tasks_.end(), [&](const auto& r) {
          return r.fingerprint.seq == task.fingerprint.seq;
        }));
        mismatches_.erase(task.fingerprint.seq);
        if (task.exclusive) {
          running_exclusive_ = false;
        }
        for (const void* storage : task.storages) {
          running_storages_.erase(std::find(running_storages_.begin(), running_storages_.end(), storage));
        }
      }
      queue_cv_.notify_all(); // the next task may wait for this one
    }
  }

  // Note [Two Gloo tasks at once]
  // A task starts while another runs only when neither is exclusive (a
  // barrier, which must follow everything issued before it) and they share
  // no tensor storage: then their order cannot be observed, and the staging
  // copies of one CUDA task (device to host, host to device) overlap the
  // other's network transfer, as DDP's gradient buckets need. Tags keep the
  // two tasks' messages apart. At most kWorkerThreads run at once.
  bool can_start_locked(const Task& next) const {
    if (running_ == 0) {
      return true;
    }
    if (running_ >= kWorkerThreads || running_exclusive_ || next.exclusive) {
      return false;
    }
    for (const void* storage : next.storages) {
      if (std::find(running_storages_.begin(), running_storages_.end(), storage) != running_storages_.end()) {
        return false;
      }
    }
    return true;
  }

  void run_task(Task& task) {
    std::string broken_message;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      broken_message = broken_message_;
    }
    if (!broken_message.empty()) {
      fail(task, std::make_exception_ptr(CommError(c10::str(
                     task.work->name(), ": not run, because the process group failed earlier and is unusable: ",
                     broken_message, ". Destroy the group and start a new one."))));
      return;
    }
    std::exception_ptr error;
    try {
      task.fence.wait();
      auto outputs = task.run(internal::fingerprint_tag(task.fingerprint), task.timeout, task.work->name());
      // The task's closure holds the caller's tensors: release them before
      // the Work completes, while the caller still waits, so that the last
      // reference is never dropped here after the caller has moved on (an
      // order that TSan cannot see when LibTorch's own, uninstrumented copy
      // of the reference counting runs).
      task.run = nullptr;
      if (recorder_) {
        recorder_->completed(task.record);
      }
      task.work->set_result(std::move(outputs));
      return;
    } catch (const gloo::IoException& e) {
      error = convert_io_error(task, e.what());
    } catch (const RemoteError& e) {
      // A peer found gone outside the transport (cross-memory reads: its
      // process exited, or its gradients let go). Recorded as a lost
      // connection is, with the first failure's clause (Note [First
      // failure]), so that a rank that then loses its connection to this
      // one, once it exits, names that peer too.
      const std::string clause =
          internal::first_failure_clause(record_lost_peer(task, e.peer_rank()), {e.peer_rank()});
      error = clause.empty() ? std::current_exception()
                             : std::make_exception_ptr(RemoteError(e.what() + clause, e.peer_rank()));
      mark_broken(e.what());
    } catch (const CommError& e) {
      error = std::current_exception();
      mark_broken(e.what());
    } catch (const c10::Error&) {
      error = std::current_exception(); // misuse caught late; the group stays usable
    } catch (const std::exception& e) {
      // gloo::EnforceNotMet among others: never let it reach std::terminate.
      error = convert_io_error(task, error_message(e));
    } catch (...) {
      error = convert_io_error(task, "an exception of unknown type");
    }
    task.run = nullptr; // as above
    fail(task, error);
  }

  // Fails the task's Work, its flight recorder entry first (which writes the
  // dump before the caller sees the error: Note [Flight recorder]).
  void fail(Task& task, std::exception_ptr error) {
    if (recorder_) {
      recorder_->failed(task.record, error);
    }
    task.work->set_error(std::move(error));
  }

  // What the store tells of a failed task (Note [Collective fingerprints],
  // Note [First failure]): the mismatch, when its ranks called different
  // collectives; for a timeout, the ranks that had not reached it; the
  // group's first failure, which this one becomes unless one is recorded.
  struct Diagnosis {
    std::optional<std::string> mismatch;
    internal::Absentees missing;
    std::optional<internal::FailureReport> first;
    bool store_gone = false; // `missing` is what the monitor last read
  };

  // Reads the store for `task`'s failure (a timeout, or a connection lost to
  // `peer`, -1 when unknown; `stalled`: the task had run for kLongStall, see
  // Note [A lost peer that timed out]) within kDiagnosisBudget: a store whose server
  // cannot be reached (a link down) must not hold the error back past the
  // caller's deadline. nullopt when it did not answer in time; its calls
  // then finish on their own thread. The mismatch that the monitor found
  // for the task's collective comes first: a peer that found it first has
  // shut the connections down, which is how this task failed.
  std::optional<Diagnosis> diagnose(const Task& task, bool timed_out, int peer, bool stalled) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto found = mismatches_.find(task.fingerprint.seq);
      if (found != mismatches_.end()) {
        return Diagnosis{found->second, {}, std::nullopt};
      }
    }
    if (group_.size() < 2) {
      return Diagnosis{};
    }
    return internal::run_within<Diagnosis>(
        kDiagnosisBudget,
        [fingerprints = fingerprints_, failures = failures_, fingerprint = task.fingerprint, rank = group_.rank(),
         timed_out, peer, stalled] {
          Diagnosis found;
          try {
            found.mismatch = fingerprints->publish_and_compare(fingerprint);
            if (found.mismatch) {
              return found;
            }
            const std::string op = c10::str(fingerprint.op, " #", fingerprint.seq);
            if (timed_out) {
              // What the compare above just read: the same store calls
              // twice would spend the budget for nothing.
              found.missing = fingerprints->ranks_missing_when_last_compared(fingerprint.seq);
              // A rank still in an earlier collective waits for someone
              // else, as this one does: only the unseen are blamed.
              found.first = found.missing.unseen.empty()
                                ? failures->first()
                                : failures->record({found.missing.unseen.front(),
                                                    c10::str("rank ", rank, " timed out in ", op, " waiting for it")});
            } else if (peer < 0) {
              found.first = failures->first();
            } else {
              if (stalled) {
                found.missing = fingerprints->ranks_missing_when_last_compared(fingerprint.seq);
              }
              const auto& unseen = found.missing.unseen;
              // A peer that waited in this collective beside this rank and
              // then left (Gloo closes a rank's connections when it times
              // out) was waiting for the ranks that never came.
              found.first =
                  unseen.empty() || std::find(unseen.begin(), unseen.end(), peer) != unseen.end()
                      ? failures->record({peer, c10::str("rank ", rank, " lost its connection to it in ", op)})
                      : failures->record({unseen.front(), c10::str("rank ", rank, " lost its connection to rank ",
                                                                   peer, " in ", op, ", which rank ",
                                                                   unseen.front(), " had not reached")});
            }
          } catch (const std::exception&) {
            // The store is gone (its server ended with rank 0): what this
            // rank's monitor last read of it.
            if (found.missing.empty()) {
              found.missing = fingerprints->ranks_missing_when_last_compared(fingerprint.seq);
              found.store_gone = true;
            }
          }
          return found;
        });
  }

  // Note [First failure] for a peer that `task` found gone itself, within
  // kDiagnosisBudget (the store may be gone): the group's first failure,
  // this one or an earlier one; nullopt when the store did not answer.
  // Never throws.
  std::optional<internal::FailureReport> record_lost_peer(const Task& task, int peer) {
    if (failures_ == nullptr || peer < 0 || peer >= group_.size() || group_.size() < 2) {
      return std::nullopt;
    }
    const std::string seen = c10::str("rank ", group_.rank(), " found it gone in ", task.fingerprint.op, " #",
                                      task.fingerprint.seq);
    try {
      return internal::run_within<std::optional<internal::FailureReport>>(
                 kDiagnosisBudget, [failures = failures_, peer, seen] { return failures->record({peer, seen}); })
          .value_or(std::nullopt);
    } catch (const std::exception&) {
      return std::nullopt; // the ledger never throws; the thread that runs it might not start
    }
  }

  // How long `task` has run (zero once it is no longer running).
  std::chrono::steady_clock::duration ran_for(const Task& task) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& running : running_tasks_) {
      if (running.fingerprint.seq == task.fingerprint.seq) {
        return std::chrono::steady_clock::now() - running.start;
      }
    }
    return {};
  }

  std::exception_ptr convert_io_error(const Task& task, const std::string& what) {
    const bool timed_out = internal::classify_gloo_error(what) == internal::GlooFailure::kTimeout;
    // Gloo names a lost peer by its socket address.
    const int peer = timed_out ? -1 : peer_of(what);
    // Note [Silent peers]: the ranks whose host stopped answering, as this
    // rank's own connections last saw them (read first: the store may take
    // its whole budget).
    const std::string silent = silent_peers_->clause();
    const auto diagnosis = diagnose(task, timed_out, peer, !timed_out && ran_for(task) >= kLongStall);
    const std::string unanswered =
        diagnosis ? std::string()
                  : c10::str("; the group's store did not answer within ", kDiagnosisBudget.count(),
                             " ms either (its server, on rank 0's host under ddprun and torchrun, may be unreachable)");
    std::exception_ptr error;
    if (diagnosis && diagnosis->mismatch) {
      error = std::make_exception_ptr(CollectiveMismatchError(c10::str(task.work->name(), ": ", *diagnosis->mismatch)));
      try {
        fingerprints_->acknowledge_mismatch(task.fingerprint.seq,
                                            std::min<std::chrono::milliseconds>(kMismatchPatience, task.timeout));
      } catch (const std::exception&) {
        // The store is gone: the other ranks report what they can.
      }
    } else if (timed_out) {
      const internal::Absentees missing = diagnosis ? diagnosis->missing : internal::Absentees{};
      const std::string missing_clause = missing.clause(
          task.fingerprint.op, task.fingerprint.seq,
          diagnosis && diagnosis->store_gone ? " when this rank last read the store" : "");
      error = std::make_exception_ptr(TimeoutError(c10::str(
          task.work->name(), ": timed out after ", task.timeout.count(),
          " ms waiting for a peer (a rank may be stuck, dead, or issuing collectives in a "
          "different order)", missing_clause,
          internal::first_failure_clause(diagnosis ? diagnosis->first : std::nullopt, missing.unseen), unanswered,
          silent, ". Gloo said: ", what)));
    } else {
      // The ranks that had not arrived may be why the peer left: as the
      // store says after a long wait (Note [A lost peer that timed out]), or
      // as this rank last read it when the store has gone.
      const internal::Absentees missing = diagnosis ? diagnosis->missing : internal::Absentees{};
      const std::string absent = missing.clause(
          task.fingerprint.op, task.fingerprint.seq,
          diagnosis && diagnosis->store_gone ? " when this rank last read the store" : "");
      // The group's first failure is told unless it is the peer: beside
      // the absentees it says who failed first, and why.
      const std::vector<int> named = peer >= 0 ? std::vector<int>{peer} : std::vector<int>{};
      error = std::make_exception_ptr(RemoteError(
          c10::str(task.work->name(), ": lost connection to ",
                   peer >= 0 ? c10::str("rank ", peer) : std::string("a peer"),
                   " (this is rank ", group_.rank(), "); the peer probably exited or crashed", absent,
                   internal::first_failure_clause(diagnosis ? diagnosis->first : std::nullopt, named),
                   unanswered, silent, ". Gloo said: ", what),
          peer));
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      mark_broken(error_message(e));
    }
    return error;
  }

  // Note [Collective fingerprints] explains this thread. It wakes every
  // kMonitorInterval and compares the fingerprint of every task that has run
  // for kStallDelay or more with the other ranks'. Runs until the group stops.
  void run_monitor() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      monitor_cv_.wait_for(lock, kMonitorInterval);
      if (stop_ || group_.size() < 2) {
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      std::vector<internal::Fingerprint> stalled;
      for (const auto& running : running_tasks_) {
        if (now - running.start >= kStallDelay && mismatches_.count(running.fingerprint.seq) == 0) {
          stalled.push_back(running.fingerprint);
        }
      }
      lock.unlock();
      // Note [Silent peers]: the connections' view, kept for the error.
      silent_peers_->set_stalled(!stalled.empty());
      for (const auto& fingerprint : stalled) {
        std::optional<std::string> mismatch;
        try {
          mismatch = fingerprints_->publish_and_compare(fingerprint);
        } catch (const std::exception&) {
          // The store failed: the task ends at its own deadline instead.
        }
        if (mismatch) {
          {
            std::lock_guard<std::mutex> guard(mutex_);
            mismatches_[fingerprint.seq] = *mismatch;
          }
          mark_broken(c10::str(who(), " ", fingerprint.op, " #", fingerprint.seq, ": ", *mismatch));
          // The task waits for messages that will never come: end it now.
          internal::shut_down_connections(peer_addresses_);
        }
      }
      lock.lock();
    }
  }

  void mark_broken(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_message_.empty()) {
      broken_message_ = message.empty() ? std::string("an earlier collective failed") : message;
    }
  }

  ProcessGroupGloo& group_; // owns this Impl, so outlives it
  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::Context> context_;
  internal::shm::SharedBuffers shared_;
  // The smallest buffer offered in shared memory; -1: none
  // (ProcessGroupGlooOptions::shared_memory_min_bytes, DDP_GLOO_SHM).
  const int64_t shared_wanted_;
  // The address of the other end of each pair, and its rank; written by
  // connect, read-only after.
  std::vector<std::pair<std::string, int>> peer_addresses_;
  // Set by connect, before the monitor starts; told by the monitor when a
  // collective stalls (Note [Silent peers]).
  std::unique_ptr<internal::SilentPeers> silent_peers_;

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_; // guarded by mutex_
  uint64_t next_seq_ = 0; // guarded by mutex_
  bool stop_ = false; // guarded by mutex_
  // Two workers: with a single worker, a worker preempted while holding a
  // Gloo pair's lock makes Gloo's event loop spin until the next scheduler
  // tick (about 4 ms per small collective when ranks share cores);
  // torch.distributed's Gloo group runs two workers by default for the same
  // reason. They also let two independent tasks overlap; see Note [Two Gloo
  // tasks at once].
  static constexpr int kWorkerThreads = 2;
  int running_ = 0; // guarded by mutex_
  bool running_exclusive_ = false; // guarded by mutex_
  std::vector<const void*> running_storages_; // guarded by mutex_
  std::vector<std::thread> workers_;

  // The first failure's message; empty while the group is healthy.
  std::string broken_message_; // guarded by mutex_

  // See Note [Collective fingerprints].
  struct RunningTask {
    internal::Fingerprint fingerprint;
    std::chrono::steady_clock::time_point start;
  };
  static constexpr std::chrono::milliseconds kStallDelay{1000};
  static constexpr std::chrono::milliseconds kMonitorInterval{250};
  // Note [A lost peer that timed out]. Gloo closes all of a rank's
  // connections the moment one of its operations times out, before that
  // rank has read the store to say whom it waited for, so its peers fail
  // at once with a lost connection to it. Blaming it would be wrong when
  // it, like them, was waiting for ranks that never came (a link to another
  // host down, say): its record in the store (Note [First failure]) may come
  // too late, or never, when rank 0, the store's server, exits first. A
  // rank whose collective had run for kLongStall when it lost a peer
  // therefore reads who had not reached the collective, as a timeout does
  // (every rank in it that long has published its fingerprint: the
  // monitor's kStallDelay and kMonitorInterval, with room to spare), names
  // them in its error and blames the first of them unless the lost peer is
  // among them. A shorter collective says nothing of absentees: a rank in it
  // for less than kStallDelay has not published, and would read as absent.
  static constexpr std::chrono::milliseconds kLongStall{2000};
  // How long a rank that found a mismatch waits for the other ranks in that
  // collective to find it too (FingerprintExchange::acknowledge_mismatch).
  static constexpr std::chrono::milliseconds kMismatchPatience{5000};
  // How long a failed task's error waits for the store to explain it
  // (diagnose); well within the grace Work::wait gives the task's own error.
  static constexpr std::chrono::milliseconds kDiagnosisBudget{1000};
  std::vector<RunningTask> running_tasks_; // guarded by mutex_
  // The mismatch found for each running task's sequence number.
  std::map<uint64_t, std::string> mismatches_; // guarded by mutex_
  // Set by connect; shared with diagnose's calls, which may outlive the group.
  std::shared_ptr<internal::FingerprintExchange> fingerprints_;
  std::shared_ptr<internal::FailureLedger> failures_;
  std::shared_ptr<internal::FlightRecorder> recorder_;          // null when off
  std::condition_variable monitor_cv_; // wakes the monitor when the group stops
  std::thread monitor_;
};

} // namespace ddp
