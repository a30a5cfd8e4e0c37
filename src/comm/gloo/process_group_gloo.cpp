// The Gloo backend.
//
// How it works. `create` meets the other ranks through the Store (see
// gloo_rendezvous.h) and builds one Gloo context: a full mesh of TCP pairs.
// Each collective call checks its arguments on the caller's thread, takes
// the next sequence number, and queues a `Task` (a closure over the tensors)
// for the group's workers. They run tasks one at a time in queue order, which
// is issue order, so every rank runs the same collectives
// in the same order: the ProcessGroup contract turned into an execution
// order. The sequence number names the task in errors and, with a hash of
// the call's fingerprint, becomes the Gloo tag of the task's messages; the
// monitor thread turns a mismatch between ranks into an error (Note
// [Collective fingerprints]).
//
// Every task calls one Gloo algorithm (a sparse allreduce: three allgathers,
// Note [Sparse allreduce]) with the deadline of the call. When one
// fails (a timeout, a peer that closed its connection), the worker converts
// Gloo's exception into our CommError family, fails that task, and marks the
// group broken: queued and later tasks then fail at once with the first error,
// because peers may be stuck mid-collective and no later collective could
// line up.
//
// CUDA tensors are staged: copied to pinned host memory before the task and
// back after it (`HostStaging`), in the order that Note [Gloo and CUDA
// streams] in comm/host_staging.h explains. send/recv bypass the queue: they post the transfer at once on
// Gloo's unbound buffers and complete in `Work::wait`, both on the caller's
// thread and current stream.

#include <ddp/comm/process_group_gloo.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <ddp/comm/error.h>

#include "comm/collective_checks.h"
#include "comm/fingerprint.h"
#include "comm/gloo/gloo_api.h"
#include "comm/gloo/gloo_exchange_allreduce.h"
#include "comm/gloo/gloo_rendezvous.h"
#include "comm/host_staging.h"
#include "comm/gloo/sigpipe_guard.h"
#include "comm/reduce_kernels.h"
#include "internal/check.h"

namespace ddp {

namespace {

// Slot prefix of send/recv; Gloo's own algorithms use 0x01 to 0x08.
constexpr uint8_t kPointToPointSlotPrefix = 0x20;

// Gloo algorithms only need the element size, so every dtype moves as
// unsigned words of its size: `set` gets the tensor's data as a pointer to
// such words, and its element count.
template <typename Set>
void as_words(const at::Tensor& tensor, Set&& set) {
  void* data = tensor.data_ptr();
  const size_t count = static_cast<size_t>(tensor.numel());
  switch (tensor.element_size()) {
    case 1:
      set(static_cast<uint8_t*>(data), count);
      break;
    case 2:
      set(static_cast<uint16_t*>(data), count);
      break;
    case 4:
      set(static_cast<uint32_t*>(data), count);
      break;
    default:
      set(static_cast<uint64_t*>(data), count);
      break;
  }
}

template <typename Options>
void set_output(Options& options, const at::Tensor& tensor) {
  as_words(tensor, [&options](auto* data, size_t count) { options.setOutput(data, count); });
}

template <typename Options>
void set_input(Options& options, const at::Tensor& tensor) {
  as_words(tensor, [&options](auto* data, size_t count) { options.setInput(data, count); });
}

// Note [Sparse allreduce]
// Gloo has no sparse collective, so a sparse allreduce is three allgathers
// under the task's tag, one after the other, as PyTorch's Gloo backend does
// it: a header per rank (dimensions, sparse dimensions, entries, elements
// per entry); every rank's sizes and indices; every rank's values. Gloo's
// allgather moves the same count from every rank, so each rank's indices and
// values are padded to the largest count. Every rank then concatenates all
// the entries in rank order and coalesces them: duplicate indices are
// added, so every rank ends with the same coalesced sum, which replaces the
// tensor's indices and values. Ranks whose tensors differ in dimensions or
// sizes all see it from the header and the sizes, and all raise the same
// c10::Error before the next allgather, so the group stays usable. CUDA
// tensors are reduced through host memory.

// Gathers each rank's `input` (1-D, contiguous, at most `max_count`
// elements) padded to `max_count`: rank r's lands at r * max_count.
at::Tensor allgather_padded(const std::shared_ptr<gloo::Context>& context, const at::Tensor& input,
                            int64_t max_count, uint32_t tag, std::chrono::milliseconds timeout) {
  auto gathered = at::zeros({context->size * max_count}, input.options());
  if (max_count == 0) {
    return gathered;
  }
  auto padded = at::zeros({max_count}, input.options());
  padded.narrow(0, 0, input.numel()).copy_(input);
  gloo::AllgatherOptions o(context);
  set_input(o, padded);
  set_output(o, gathered);
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::allgather(o);
  return gathered;
}

// See Note [Sparse allreduce]. Runs on a worker thread; `who` is
// "[rank R/W] allreduce #N".
void sparse_allreduce(const std::shared_ptr<gloo::Context>& context, const at::Tensor& tensor,
                      const std::string& who, uint32_t tag, std::chrono::milliseconds timeout) {
  const int size = context->size;
  const auto local = tensor.to(at::kCPU).coalesce();
  const int64_t dim = local.dim();
  const int64_t sparse_dim = local.sparse_dim();
  const int64_t nnz = local._nnz();
  const auto sizes = local.sizes().vec();
  const std::vector<int64_t> dense_sizes(sizes.begin() + sparse_dim, sizes.end());
  int64_t per_entry = 1;
  for (int64_t s : dense_sizes) {
    per_entry *= s;
  }
  const auto longs = at::TensorOptions(at::kLong);

  const auto header =
      allgather_padded(context, at::tensor(std::vector<int64_t>{dim, sparse_dim, nnz, per_entry}, longs),
                       4, tag, timeout);
  const auto* h = header.data_ptr<int64_t>();
  int64_t max_nnz = 0;
  int64_t total_nnz = 0;
  // Each rank against rank 0's, so that every rank raises the same error.
  for (int r = 0; r < size; ++r) {
    DDP_CHECK(h[4 * r] == h[0] && h[4 * r + 1] == h[1], who,
              ": the sparse tensors differ across ranks: rank ", r, "'s has ", h[4 * r],
              " dimensions of which ", h[4 * r + 1], " sparse, but rank 0's ", h[0], " of which ",
              h[1], "; every rank must pass a tensor of the same sizes");
    max_nnz = std::max(max_nnz, h[4 * r + 2]);
    total_nnz += h[4 * r + 2];
  }

  // Sizes, then indices (sparse_dim rows of nnz), per rank.
  const auto mine = at::cat({at::tensor(sizes, longs), local._indices().reshape({-1})});
  const int64_t index_slot = dim + sparse_dim * max_nnz;
  const auto indices = allgather_padded(context, mine, index_slot, tag, timeout);
  const c10::IntArrayRef rank0_sizes(indices.data_ptr<int64_t>(), static_cast<size_t>(dim));
  for (int r = 0; r < size; ++r) {
    const c10::IntArrayRef theirs(indices.data_ptr<int64_t>() + r * index_slot, static_cast<size_t>(dim));
    DDP_CHECK(theirs == rank0_sizes, who, ": the sparse tensors differ across ranks: rank ", r,
              "'s has sizes ", theirs, ", but rank 0's ", rank0_sizes,
              "; every rank must pass a tensor of the same sizes");
  }
  const int64_t value_slot = per_entry * max_nnz;
  const auto values =
      allgather_padded(context, local._values().contiguous().reshape({-1}), value_slot, tag, timeout);

  std::vector<at::Tensor> all_indices;
  std::vector<at::Tensor> all_values;
  auto value_shape = dense_sizes;
  for (int r = 0; r < size; ++r) {
    const int64_t n = h[4 * r + 2];
    all_indices.push_back(indices.narrow(0, r * index_slot + dim, sparse_dim * n).view({sparse_dim, n}));
    value_shape.insert(value_shape.begin(), n);
    all_values.push_back(values.narrow(0, r * value_slot, per_entry * n).view(value_shape));
    value_shape.erase(value_shape.begin());
  }
  DDP_INTERNAL_ASSERT(static_cast<int64_t>(at::cat(all_indices, 1).size(1)) == total_nnz);
  const auto sum = at::sparse_coo_tensor(at::cat(all_indices, 1), at::cat(all_values, 0), sizes,
                                         local.options())
                       .coalesce();
  tensor.copy_(sum);
}

} // namespace

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
  };

  Impl(ProcessGroupGloo& group, std::shared_ptr<Store> store,
       const ProcessGroupGlooOptions& options)
      : group_(group), store_(std::move(store)) {
    // The rendezvous writes to Gloo's sockets from this thread, and every
    // thread started here (Gloo's event loop, the workers, the monitor)
    // begins life with this thread's signal mask, so SIGPIPE is blocked in
    // them from their first instruction: See Note [SIGPIPE and Gloo].
    internal::SigpipeGuard guard;
    connect(options);
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
    Task task{work,  timeout, std::move(run), std::move(fingerprint),
              internal::StreamFence::record(keep), {}, false};
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
  // `output` (allgather into one tensor, alltoall).
  // `algorithm` is the Gloo function (its options are const in some Gloo
  // versions and not in others).
  template <typename GlooOptions, typename Algorithm>
  std::shared_ptr<Work> enqueue_input_output(const char* op_name, std::chrono::milliseconds timeout,
                                             const at::Tensor& output, const at::Tensor& input,
                                             Algorithm algorithm) {
    auto context = context_;
    internal::Fingerprint fingerprint{op_name, input.scalar_type(), input.numel()};
    return enqueue(std::move(fingerprint), timeout, {output, input},
                   [output, input, context, algorithm](uint32_t tag, std::chrono::milliseconds timeout) {
                     internal::HostStaging staging;
                     auto host_input = staging.in(input);
                     auto host_output = staging.in(output);
                     if (input.numel() > 0) {
                       GlooOptions o(context);
                       set_input(o, host_input);
                       set_output(o, host_output);
                       o.setTag(tag);
                       o.setTimeout(timeout);
                       algorithm(o);
                     }
                     staging.copy_back();
                     return std::vector<at::Tensor>{output};
                   });
  }

  std::shared_ptr<gloo::Context> context() const {
    return context_;
  }

  // Until the queue is empty and no task runs. Each task ends by its
  // deadline, so this does too.
  void wait_until_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    queue_cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  }

  // Posts a send or receive at once; see PointToPointWork.
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

    const auto choice = internal::choose_device(options.interface(), options.hostname(),
                                                options.master_addr(), group_.size());
    auto device = internal::make_gloo_device(choice, who());
    auto context = std::make_shared<gloo::rendezvous::Context>(group_.rank(), group_.size());
    context->setTimeout(timeout);
    internal::GlooStoreAdapter adapter(store_, prefix + "gloo/", timeout);
    try {
      context->connectFullMesh(adapter, device);
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw IoError(c10::str(who(), " init_process_group: Gloo could not connect to the other ranks (bound to ",
                             choice.interface.empty() ? choice.hostname : choice.interface,
                             ", chosen from ", choice.reason, "): ", e.what()));
    }
    context_ = std::move(context);
    // Nobody leaves rendezvous before everyone is connected: a rank that
    // destroyed its group at once would otherwise close connections a slower
    // peer is still setting up (PyTorch's store-based barrier does the same).
    peer_addresses_ = internal::exchange_peer_addresses(*context_, *store_, prefix, group_.rank(),
                                                        group_.size(), timeout);
    fingerprints_ = std::make_unique<internal::FingerprintExchange>(store_, prefix + "fp/", group_.rank(),
                                                                   group_.size());
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
      task.work->set_error(std::make_exception_ptr(CommError(c10::str(
          task.work->name(), ": not run, because the process group failed earlier and is unusable: ",
          broken_message, ". Destroy the group and start a new one."))));
      return;
    }
    std::exception_ptr error;
    try {
      task.fence.wait();
      auto outputs = task.run(internal::fingerprint_tag(task.fingerprint), task.timeout, task.work->name());
      task.work->set_result(std::move(outputs));
      return;
    } catch (const gloo::IoException& e) {
      error = convert_io_error(task, e.what());
    } catch (const CommError& e) {
      error = std::current_exception();
      mark_broken(e.what());
    } catch (const c10::Error&) {
      error = std::current_exception(); // misuse caught late; the group stays usable
    } catch (const std::exception& e) {
      // gloo::EnforceNotMet among others: never let it reach std::terminate.
      error = convert_io_error(task, e.what());
    } catch (...) {
      error = convert_io_error(task, "an exception of unknown type");
    }
    task.work->set_error(error);
  }

  // The mismatch that the monitor found for `fingerprint`'s collective, or
  // else the one that comparing it with the store now shows (a peer that
  // found it first has shut the connections down, which is how this task
  // failed). Never throws.
  std::optional<std::string> find_mismatch(const internal::Fingerprint& fingerprint) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto found = mismatches_.find(fingerprint.seq);
      if (found != mismatches_.end()) {
        return found->second;
      }
    }
    if (group_.size() < 2) {
      return std::nullopt;
    }
    try {
      return fingerprints_->publish_and_compare(fingerprint);
    } catch (const std::exception&) {
      return std::nullopt; // the store is gone too: report the Gloo error alone
    }
  }

  // ", ranks [2] had not reached allreduce #4" for a timeout, or "" when
  // every rank had (as far as the store knows; see FingerprintExchange).
  std::string missing_ranks_clause(const internal::Fingerprint& fingerprint) {
    try {
      const auto missing = fingerprints_->ranks_missing(fingerprint.seq);
      if (missing.empty()) {
        return "";
      }
      return c10::str("; rank(s) ", c10::ArrayRef<int>(missing), " had not reached ", fingerprint.op, " #",
                      fingerprint.seq);
    } catch (const std::exception&) {
      return "";
    }
  }

  std::exception_ptr convert_io_error(const Task& task, const std::string& what) {
    std::exception_ptr error;
    if (const auto mismatch = find_mismatch(task.fingerprint)) {
      error = std::make_exception_ptr(CollectiveMismatchError(c10::str(task.work->name(), ": ", *mismatch)));
    } else if (what.find("imed out") != std::string::npos) {
      error = std::make_exception_ptr(TimeoutError(c10::str(
          task.work->name(), ": timed out after ", task.timeout.count(),
          " ms waiting for a peer (a rank may be stuck, dead, or issuing collectives in a "
          "different order)", missing_ranks_clause(task.fingerprint), ". Gloo said: ", what)));
    } else {
      // Gloo names the peer by its socket address.
      const int peer = peer_of(what);
      error = std::make_exception_ptr(RemoteError(
          c10::str(task.work->name(), ": lost connection to ",
                   peer >= 0 ? c10::str("rank ", peer) : std::string("a peer"),
                   " (this is rank ", group_.rank(), "); the peer probably exited or crashed. Gloo said: ",
                   what),
          peer));
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      mark_broken(e.what());
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
  // The address of the other end of each pair, and its rank; written by
  // connect, read-only after.
  std::vector<std::pair<std::string, int>> peer_addresses_;

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
  std::vector<RunningTask> running_tasks_; // guarded by mutex_
  // The mismatch found for each running task's sequence number.
  std::map<uint64_t, std::string> mismatches_; // guarded by mutex_
  std::unique_ptr<internal::FingerprintExchange> fingerprints_; // set by connect
  std::condition_variable monitor_cv_; // wakes the monitor when the group stops
  std::thread monitor_;
};

namespace {

// send/recv complete when waited on: Gloo's unbound buffers post the
// transfer at once and report completion through waitSend/waitRecv.
class PointToPointWork : public Work {
 public:
  PointToPointWork(std::string name, std::chrono::milliseconds default_timeout, bool is_send,
                   at::Tensor tensor, at::Tensor host,
                   std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
      : Work(std::move(name), default_timeout),
        default_timeout_(default_timeout),
        is_send_(is_send),
        tensor_(std::move(tensor)),
        host_(std::move(host)),
        buffer_(std::move(buffer)) {}

  ~PointToPointWork() override {
    std::lock_guard<std::mutex> lock(transfer_mutex_);
    if (!is_completed() && buffer_) {
      // Nobody waited: cancel so that Gloo no longer writes into the tensor.
      if (is_send_) {
        buffer_->abortWaitSend();
      } else {
        buffer_->abortWaitRecv();
      }
    }
  }

  void wait(std::chrono::milliseconds timeout) override {
    if (timeout == kUseGroupTimeout) {
      timeout = default_timeout_;
    }
    {
      std::lock_guard<std::mutex> lock(transfer_mutex_);
      if (!is_completed()) {
        try {
          const bool done = is_send_ ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
          if (!done) {
            throw CommError(c10::str(name(), ": the transfer was aborted"));
          }
          if (!is_send_ && host_.data_ptr() != tensor_.data_ptr()) {
            tensor_.copy_(host_);
          }
          set_result({tensor_});
        } catch (const gloo::IoException& e) {
          const std::string what = e.what();
          if (what.find("imed out") != std::string::npos || what.find("timeout") != std::string::npos) {
            set_error(std::make_exception_ptr(TimeoutError(
                c10::str(name(), ": timed out after ", timeout.count(), " ms. Gloo said: ", what))));
          } else {
            set_error(std::make_exception_ptr(
                RemoteError(c10::str(name(), ": lost connection to the peer. Gloo said: ", what), -1)));
          }
        } catch (...) {
          set_error(std::current_exception());
        }
      }
    }
    Work::wait(timeout);
  }

 private:
  const std::chrono::milliseconds default_timeout_;
  const bool is_send_;
  at::Tensor tensor_;
  at::Tensor host_;
  std::mutex transfer_mutex_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_; // guarded by transfer_mutex_
};

} // namespace

// ---- Construction ------------------------------------------------------------

std::shared_ptr<ProcessGroupGloo> ProcessGroupGloo::create(
    std::shared_ptr<Store> store, int rank, int size, const ProcessGroupGlooOptions& options) {
  return std::make_shared<ProcessGroupGloo>(PrivateTag{}, std::move(store), rank, size, options);
}

ProcessGroupGloo::ProcessGroupGloo(PrivateTag, std::shared_ptr<Store> store, int rank, int size,
                                   const ProcessGroupGlooOptions& options)
    : ProcessGroup(rank, size, options.timeout()) {
  DDP_CHECK(store != nullptr, rank_prefix(), " ProcessGroupGloo: the store is null");
  set_supports_sparse_allreduce(true); // Note [Sparse allreduce]
  impl_ = std::make_unique<Impl>(*this, std::move(store), options);
}

ProcessGroupGloo::~ProcessGroupGloo() = default;

void ProcessGroupGloo::wait_for_pending_work() {
  impl_->wait_until_idle();
}

// ---- Argument checks -----------------------------------------------------------

namespace {

void check_device_and_dtype(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.is_cpu() || t.is_cuda(), who, ": ", what, " is on device ", t.device(),
            "; the Gloo backend takes CPU or CUDA tensors");
  DDP_CHECK(internal::is_supported_dtype(t.scalar_type()), who, ": ", what, " has dtype ",
            t.scalar_type(), ", which the Gloo backend does not support");
}

// Checks one tensor argument; `who` is "[rank R/W] op", `what` names the
// argument ("tensor", "outputs[2]").
void check_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  internal::check_strided(t, who, what,
                          "the Gloo backend reduces sparse tensors only in allreduce, one tensor "
                          "per call");
  DDP_CHECK(t.is_contiguous(), who, ": ", what, " must be contiguous (got sizes ", t.sizes(),
            " with strides ", t.strides(), "); pass tensor.contiguous() and copy the result back");
  check_device_and_dtype(t, who, what);
}

// The sparse COO tensor of an allreduce (see Note [Sparse allreduce]).
void check_sparse_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  DDP_INTERNAL_ASSERT(t.is_sparse());
  check_device_and_dtype(t, who, what);
}

// Gloo's rules for the checks of collective_checks.h: CPU or CUDA tensors,
// which may differ in device within an operation (CUDA ones are staged);
// sparse COO tensors in allreduce.
constexpr internal::TensorRules kGlooRules{&check_tensor, nullptr, &check_sparse_tensor};

internal::ReduceKernel checked_kernel(at::ScalarType dtype, ReduceOp op, const std::string& who) {
  auto kernel = internal::reduce_kernel(dtype, op);
  DDP_CHECK(kernel != nullptr, who, ": ", to_string(op), " is not defined for dtype ", dtype,
            op == ReduceOp::kAvg ? "; AVG needs a floating-point tensor (use SUM and divide)"
                                 : "; bitwise operations need an integer or bool tensor");
  return kernel;
}

} // namespace

// ---- Collectives -----------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupGloo::allreduce(const at::Tensor& tensor,
                                                  const AllreduceOptions& options) {
  return allreduce_coalesced({tensor}, options);
}

std::shared_ptr<Work> ProcessGroupGloo::allreduce_coalesced(
    const std::vector<at::Tensor>& tensors, const AllreduceOptions& options) {
  const std::string who = rank_prefix() + " allreduce";
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    internal::check_sparse_allreduce(tensors[0], options.op, who, kGlooRules);
    const at::Tensor tensor = tensors[0];
    auto context = impl_->context();
    // Sizes that differ are the collective's own error, after which the group
    // stays usable (Note [Sparse allreduce]); the dtype is not checked there.
    internal::Fingerprint fingerprint{"allreduce", tensor.scalar_type(), internal::Fingerprint::kSparse,
                                      options.op};
    return impl_->enqueue_named(
        std::move(fingerprint), resolve_timeout(options.timeout), tensors,
        [tensor, context](uint32_t tag, std::chrono::milliseconds timeout, const std::string& name) {
          sparse_allreduce(context, tensor, name, tag, timeout);
          return std::vector<at::Tensor>{tensor};
        });
  }
  internal::check_coalesced(tensors, who, kGlooRules);
  auto kernel = checked_kernel(tensors[0].scalar_type(), options.op, who);
  const ReduceOp op = options.op;
  const int size = this->size();
  auto context = impl_->context();
  int64_t numel = 0;
  for (const auto& t : tensors) {
    numel += t.numel();
  }
  internal::Fingerprint fingerprint{"allreduce", tensors[0].scalar_type(), numel, op};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), tensors,
      [tensors, kernel, op, size, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        // One tensor is reduced in place; several are packed into one buffer
        // so that they cost one collective.
        at::Tensor flat;
        if (tensors.size() == 1) {
          flat = staging.in(tensors[0]);
        } else {
          std::vector<at::Tensor> views;
          for (const auto& t : tensors) {
            views.push_back(t.reshape({-1}));
          }
          flat = staging.in(at::cat(views));
        }
        if (flat.numel() > 0) {
          if (internal::use_exchange_allreduce(flat.nbytes(), size)) {
            // Small: one step instead of the ring's 2 (n - 1); Note
            // [Exchange allreduce].
            internal::exchange_allreduce(context, flat.data_ptr(), static_cast<size_t>(flat.numel()),
                                         flat.nbytes(), kernel, tag, timeout);
          } else {
            gloo::AllreduceOptions o(context);
            set_output(o, flat);
            o.setReduceFunction(kernel);
            o.setTag(tag);
            o.setTimeout(timeout);
            gloo::allreduce(o);
          }
          if (op == ReduceOp::kAvg) {
            flat.div_(size);
          }
        }
        if (tensors.size() == 1) {
          staging.copy_back();
        } else {
          int64_t offset = 0;
          for (const auto& t : tensors) {
            t.view({-1}).copy_(flat.narrow(0, offset, t.numel()));
            offset += t.numel();
          }
        }
        return tensors;
      });
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(const at::Tensor& tensor,
                                                  const BroadcastOptions& options) {
  const std::string who = rank_prefix() + " broadcast";
  internal::check_rooted(tensor, options.root_rank, size(), who, kGlooRules);
  const int root = options.root_rank;
  auto context = impl_->context();
  internal::Fingerprint fingerprint{"broadcast", tensor.scalar_type(), tensor.numel(), std::nullopt, root};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), {tensor},
      [tensor, root, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host = staging.in(tensor);
        if (host.numel() > 0) {
          gloo::BroadcastOptions o(context);
          set_output(o, host);
          o.setRoot(root);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::broadcast(o);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{tensor};
      });
}

std::shared_ptr<Work> ProcessGroupGloo::reduce(const at::Tensor& tensor,
                                               const ReduceOptions& options) {
  const std::string who = rank_prefix() + " reduce";
  internal::check_rooted(tensor, options.root_rank, size(), who, kGlooRules);
  auto kernel = checked_kernel(tensor.scalar_type(), options.op, who);
  const int root = options.root_rank;
  const ReduceOp op = options.op;
  const int size = this->size();
  const int rank = this->rank();
  auto context = impl_->context();
  internal::Fingerprint fingerprint{"reduce", tensor.scalar_type(), tensor.numel(), op, root};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), {tensor},
      [tensor, kernel, root, op, size, rank, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host = staging.in(tensor);
        if (host.numel() > 0) {
          gloo::ReduceOptions o(context);
          set_output(o, host);
          o.setRoot(root);
          o.setReduceFunction(kernel);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::reduce(o);
          if (op == ReduceOp::kAvg && rank == root) {
            host.div_(size);
          }
        }
        staging.copy_back();
        return std::vector<at::Tensor>{tensor};
      });
}

std::shared_ptr<Work> ProcessGroupGloo::allgather(const std::vector<at::Tensor>& outputs,
                                                  const at::Tensor& input,
                                                  const AllgatherOptions& options) {
  const std::string who = rank_prefix() + " allgather";
  internal::check_allgather(outputs, input, size(), who, kGlooRules);
  auto context = impl_->context();
  std::vector<at::Tensor> keep(outputs);
  keep.push_back(input);
  internal::Fingerprint fingerprint{"allgather", input.scalar_type(), input.numel()};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), keep,
      [outputs, input, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host_input = staging.in(input);
        auto flat = at::empty({static_cast<int64_t>(outputs.size()) * input.numel()},
                              host_input.options());
        if (input.numel() > 0) {
          gloo::AllgatherOptions o(context);
          set_input(o, host_input);
          set_output(o, flat);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::allgather(o);
        }
        for (size_t r = 0; r < outputs.size(); ++r) {
          outputs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()));
        }
        return outputs;
      });
}

std::shared_ptr<Work> ProcessGroupGloo::allgather_into_tensor(const at::Tensor& output,
                                                              const at::Tensor& input,
                                                              const AllgatherOptions& options) {
  const std::string who = rank_prefix() + " allgather_into_tensor";
  internal::check_allgather_into_tensor(output, input, size(), who, kGlooRules);
  return impl_->enqueue_input_output<gloo::AllgatherOptions>(
      "allgather_into_tensor", resolve_timeout(options.timeout), output, input, &gloo::allgather);
}

std::shared_ptr<Work> ProcessGroupGloo::gather(const std::vector<at::Tensor>& outputs,
                                               const at::Tensor& input,
                                               const GatherOptions& options) {
  const std::string who = rank_prefix() + " gather";
  internal::check_gather(outputs, input, rank(), options.root_rank, size(), who, kGlooRules);
  const bool is_root = rank() == options.root_rank;
  const int root = options.root_rank;
  const int size = this->size();
  auto context = impl_->context();
  std::vector<at::Tensor> keep(outputs);
  keep.push_back(input);
  internal::Fingerprint fingerprint{"gather", input.scalar_type(), input.numel(), std::nullopt, root};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), keep,
      [outputs, input, root, size, is_root, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host_input = staging.in(input);
        at::Tensor flat;
        if (input.numel() > 0) {
          gloo::GatherOptions o(context);
          set_input(o, host_input);
          if (is_root) {
            flat = at::empty({size * input.numel()}, host_input.options());
            set_output(o, flat);
          }
          o.setRoot(root);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::gather(o);
          if (is_root) {
            for (size_t r = 0; r < outputs.size(); ++r) {
              outputs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()));
            }
          }
        }
        return outputs;
      });
}

std::shared_ptr<Work> ProcessGroupGloo::scatter(const at::Tensor& output,
                                                const std::vector<at::Tensor>& inputs,
                                                const ScatterOptions& options) {
  const std::string who = rank_prefix() + " scatter";
  internal::check_scatter(output, inputs, rank(), options.root_rank, size(), who, kGlooRules);
  const bool is_root = rank() == options.root_rank;
  const int root = options.root_rank;
  auto context = impl_->context();
  std::vector<at::Tensor> keep(inputs);
  keep.push_back(output);
  internal::Fingerprint fingerprint{"scatter", output.scalar_type(), output.numel(), std::nullopt, root};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), keep,
      [output, inputs, root, is_root, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host_output = staging.in(output);
        if (output.numel() > 0) {
          gloo::ScatterOptions o(context);
          std::vector<at::Tensor> host_inputs;
          if (is_root) {
            std::vector<uint8_t*> pointers;
            for (const auto& t : inputs) {
              host_inputs.push_back(staging.in(t));
              pointers.push_back(static_cast<uint8_t*>(host_inputs.back().data_ptr()));
            }
            o.setInputs<uint8_t>(pointers, static_cast<size_t>(output.nbytes()));
          }
          o.setOutput<uint8_t>(static_cast<uint8_t*>(host_output.data_ptr()),
                               static_cast<size_t>(output.nbytes()));
          o.setRoot(root);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::scatter(o);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      });
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter(const at::Tensor& output,
                                                       const std::vector<at::Tensor>& inputs,
                                                       const ReduceScatterOptions& options) {
  const std::string who = rank_prefix() + " reduce_scatter";
  internal::check_reduce_scatter(output, inputs, size(), who, kGlooRules);
  auto kernel = checked_kernel(output.scalar_type(), options.op, who);
  const ReduceOp op = options.op;
  const int size = this->size();
  const int rank = this->rank();
  auto context = impl_->context();
  std::vector<at::Tensor> keep(inputs);
  keep.push_back(output);
  // Gloo has no typed reduce-scatter for every dtype: we allreduce the packed
  // inputs and keep our chunk. That moves twice the minimum bytes; NCCL has a
  // native one.
  internal::Fingerprint fingerprint{"reduce_scatter", output.scalar_type(), output.numel(), op};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), keep,
      [output, inputs, kernel, op, size, rank, context](uint32_t tag, std::chrono::milliseconds timeout) {
        std::vector<at::Tensor> views;
        for (const auto& t : inputs) {
          views.push_back(t.reshape({-1}).cpu());
        }
        auto flat = at::cat(views);
        if (flat.numel() > 0) {
          gloo::AllreduceOptions o(context);
          set_output(o, flat);
          o.setReduceFunction(kernel);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::allreduce(o);
          if (op == ReduceOp::kAvg) {
            flat.div_(size);
          }
        }
        output.view({-1}).copy_(flat.narrow(0, rank * output.numel(), output.numel()));
        return std::vector<at::Tensor>{output};
      });
}

std::shared_ptr<Work> ProcessGroupGloo::alltoall(const at::Tensor& output, const at::Tensor& input,
                                                 const AlltoallOptions& options) {
  const std::string who = rank_prefix() + " alltoall";
  internal::check_alltoall(output, input, size(), who, kGlooRules);
  return impl_->enqueue_input_output<gloo::AlltoallOptions>(
      "alltoall", resolve_timeout(options.timeout), output, input, &gloo::alltoall);
}

std::shared_ptr<Work> ProcessGroupGloo::barrier(const BarrierOptions& options) {
  auto context = impl_->context();
  return impl_->enqueue(
      internal::Fingerprint{"barrier"}, resolve_timeout(options.timeout), {},
      [context](uint32_t tag, std::chrono::milliseconds timeout) {
        gloo::BarrierOptions o(context);
        o.setTag(tag);
        o.setTimeout(timeout);
        gloo::barrier(o);
        return std::vector<at::Tensor>{};
      });
}

// ---- Point to point ----------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupGloo::send(const at::Tensor& tensor, int dst_rank,
                                             const PointToPointOptions& options) {
  const std::string who = rank_prefix() + " send";
  internal::check_point_to_point(tensor, dst_rank, options.tag, rank(), size(), who, "destination",
                                 kGlooRules);
  return impl_->start_point_to_point(true, tensor, dst_rank, options,
                              resolve_timeout(options.timeout), c10::str(who, " to rank ", dst_rank,
                                                                         " tag ", options.tag));
}

std::shared_ptr<Work> ProcessGroupGloo::recv(const at::Tensor& tensor, int src_rank,
                                             const PointToPointOptions& options) {
  const std::string who = rank_prefix() + " recv";
  internal::check_point_to_point(tensor, src_rank, options.tag, rank(), size(), who, "source",
                                 kGlooRules);
  return impl_->start_point_to_point(false, tensor, src_rank, options,
                              resolve_timeout(options.timeout), c10::str(who, " from rank ", src_rank,
                                                                         " tag ", options.tag));
}

std::shared_ptr<Work> ProcessGroupGloo::Impl::start_point_to_point(bool is_send,
                                           const at::Tensor& tensor, int peer,
                                           const PointToPointOptions& options,
                                           std::chrono::milliseconds timeout, const std::string& who) {
  at::Tensor host = tensor;
  if (tensor.is_cuda()) {
    host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
    if (is_send) {
      host.copy_(tensor);
    }
  }
  auto buffer = context_->createUnboundBuffer(host.data_ptr(), host.nbytes());
  const uint64_t slot = gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(options.tag));
  try {
    internal::SigpipeGuard guard; // posting may write at once: See Note [SIGPIPE and Gloo]
    if (is_send) {
      buffer->send(peer, slot);
    } else {
      buffer->recv(peer, slot);
    }
  } catch (const std::exception& e) {
    // Gloo refuses to post on a connection it has closed (after an earlier
    // failure or timeout of this group).
    throw CommError(c10::str(who, ": cannot start: the connection to rank ", peer,
                             " is closed after an earlier failure. Gloo said: ", e.what()));
  }
  return std::make_shared<PointToPointWork>(who, timeout, is_send, tensor, host, std::move(buffer));
}

} // namespace ddp
