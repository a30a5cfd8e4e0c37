// The engine of the NCCL backend. See the narrative in nccl_engine.h.

#include "comm/nccl/nccl_engine.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <thread>

#include <ddp/comm/error.h>

#include "comm/recorder_outputs.h"
#include "comm/rendezvous_arrival.h"
#include "comm/nccl/nccl_engine_detail.h"
#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"

namespace ddp::internal {

using namespace nccl_detail;

// ---- Construction and destruction ------------------------------------------------------

namespace {

// DDP_NCCL_COLLECTIVE_CHECK: auto checks with two ranks or more (one rank
// cannot disagree with itself); on checks with one rank too, which is how its
// cost is measured on a machine with one GPU; off never checks.
bool collective_check_enabled(int rank, int size) {
  const auto mode = env_get(kEnvNcclCollectiveCheck).value_or("auto");
  DDP_CHECK(mode == "auto" || mode == "on" || mode == "off", "[rank ", rank, "/", size,
            "] creating an nccl process group: ", kEnvNcclCollectiveCheck.name,
            " must be auto, on or off, got '", mode, "'");
  return mode == "on" || (mode == "auto" && size > 1);
}

} // namespace

NcclEngine::NcclEngine(std::shared_ptr<Store> store, int rank, int size, NcclEngineOptions options,
                       std::string who)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      who_(std::move(who)),
      prefix_(group_prefix(options_.group_name, rank)),
      fingerprints_(collective_check_enabled(rank, size)
                        ? std::make_unique<FingerprintExchange>(store_, prefix_ + "fp/", rank, size)
                        : nullptr),
      recorder_(make_flight_recorder(options_.group_name, "nccl", rank, size)) {
  if (options_.device_index >= 0) {
    device_ = options_.device_index;
  }
  watchdog_ = std::thread([this] { run_watchdog(); });
}

void NcclEngine::wait_for_pending() {
  // The watchdog polls the pending Works' events; poll its queue likewise.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(pending_mutex_);
      if (pending_.empty()) {
        return;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

NcclEngine::~NcclEngine() {
  {
    std::lock_guard<std::mutex> lock(launch_mutex_);
    stopping_ = true;
  }
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    stop_watchdog_ = true;
  }
  pending_cv_.notify_all();
  if (watchdog_.joinable()) {
    watchdog_.join(); // returns once every pending Work completed or failed
  }
  std::lock_guard<std::mutex> lock(launch_mutex_);
  try {
    release_communicator_locked();
  } catch (const std::exception& e) {
    // The CUDA runtime may already be unloading (a group destroyed at exit).
    log_warning(c10::str(who_, " destroying the NCCL communicator: ", error_message(e)));
  }
  // Without a failure every operation's end event, and so its copy into a
  // check slot, has completed; after one, an aborted operation's copy may
  // still be queued (see FingerprintSlots).
  if (check_slots_ && failure_->message()) {
    try {
      FingerprintSlots::keep_until_exit(std::move(check_slots_));
    } catch (...) {
    }
  }
}

void NcclEngine::release_communicator_locked() {
  if (comm_ == nullptr) {
    return; // never created, or aborted
  }
  // Finalize flushes the communicator's work and frees its network
  // resources; it is bounded, and an abort replaces it if it fails or does
  // not finish in time.
  const std::string what = who_ + " destroying the NCCL communicator";
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  try {
    const auto timeout = std::min(options_.timeout, kFinalizeTimeout);
    check_nccl(ncclCommFinalize(comm_), comm_, what + ": ncclCommFinalize");
    wait_until_ready(comm_, std::chrono::steady_clock::now() + timeout, timeout, what);
  } catch (const std::exception& e) {
    log_warning(c10::str(error_message(e), "; aborting the communicator instead"));
    abort_communicator_locked();
    return;
  }
  const ncclResult_t result = ncclCommDestroy(comm_);
  comm_ = nullptr;
  if (result != ncclSuccess) {
    log_warning(c10::str(what, ": ncclCommDestroy failed with ", nccl_result_text(result)));
  }
}

// ---- Devices -------------------------------------------------------------------------------

int NcclEngine::device() const {
  std::lock_guard<std::mutex> lock(launch_mutex_);
  return device_;
}

int NcclEngine::bind_device(int requested, const std::string& who) {
  std::lock_guard<std::mutex> lock(launch_mutex_);
  return bind_device_locked(requested, who);
}

int NcclEngine::bind_device_locked(int requested, const std::string& who) {
  if (device_ < 0) {
    device_ = requested >= 0 ? requested : default_device();
    return device_;
  }
  DDP_CHECK(requested < 0 || requested == device_, who, ": the tensors are on cuda:", requested,
            ", but this process group drives cuda:", device_,
            " (the NCCL backend drives one GPU per process; move the tensors to cuda:", device_,
            ", or give each process its own device, e.g. from LOCAL_RANK)");
  return device_;
}

int NcclEngine::default_device() const {
  const int count = static_cast<int>(c10::cuda::device_count());
  DDP_CHECK(count > 0, who_, " ProcessGroupNCCL: no CUDA device is visible to this process");
  int base = rank_;
  if (auto local_rank = env_get(kEnvLocalRank)) {
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(local_rank->c_str(), &end, 10);
    if (!local_rank->empty() && *end == '\0' && errno == 0 && value >= 0) {
      base = static_cast<int>(value);
    }
  }
  return base % count;
}

// ---- The communicator ----------------------------------------------------------------------

void NcclEngine::ensure_communicator(const std::string& what) {
  if (comm_ != nullptr) {
    return;
  }
  const auto timeout = options_.timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string creating = what + ": creating the NCCL communicator";
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));

  // Every rank must arrive first: a missing rank is then named, where NCCL
  // would only time out.
  try {
    wait_for_all_ranks(*store_, prefix_, rank_, size_, timeout, who_);
  } catch (const TimeoutError& e) {
    throw TimeoutError(c10::str(creating, ": ", e.what()));
  }

  ncclUniqueId id;
  const std::string key = prefix_ + "unique_id";
  if (rank_ == 0) {
    check_nccl(ncclGetUniqueId(&id), nullptr, creating + ": ncclGetUniqueId");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store_->set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  } else {
    try {
      store_->wait({key}, remaining(deadline));
    } catch (const TimeoutError& e) {
      throw TimeoutError(c10::str(creating, ": rank 0 did not publish the NCCL unique id in time: ",
                                  e.what()));
    }
    const auto value = store_->get(key);
    if (value.size() != sizeof(id)) {
      throw CommError(c10::str(creating, ": the NCCL unique id from rank 0 has ", value.size(),
                               " bytes, expected ", sizeof(id),
                               " (do all ranks use the same NCCL version?)"));
    }
    std::memcpy(&id, value.data(), sizeof(id));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  try {
    check_nccl(result, comm, creating + ": ncclCommInitRankConfig");
    wait_until_ready(comm, deadline, timeout, creating);
  } catch (...) {
    if (comm != nullptr) {
      (void)ncclCommAbort(comm);
    }
    throw;
  }
  comm_ = comm;
  stream_ = c10::cuda::getStreamFromPool(options_.high_priority_stream,
                                         static_cast<c10::DeviceIndex>(device_));
  ready_event_ = std::make_unique<CudaEvent>();
}

void NcclEngine::wait_until_ready(ncclComm_t comm, std::chrono::steady_clock::time_point deadline,
                                  std::chrono::milliseconds timeout, const std::string& what,
                                  const std::function<void()>& on_poll) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm, &state), comm, what + ": ncclCommGetAsyncError");
    if (state == ncclSuccess) {
      return;
    }
    check_nccl(state, comm, what); // throws unless still in progress
    if (on_poll) {
      on_poll();
    }
    if (abort_requested_.load()) {
      throw CommError(c10::str(what, ": abandoned, because the watchdog is aborting the communicator"));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(c10::str(
          what, ": timed out after ", timeout.count(),
          " ms waiting for NCCL (a rank may be missing, stuck, or issuing operations in a different "
          "order; NCCL_DEBUG=INFO shows what NCCL was doing)"));
    }
    backoff.pause();
  }
}

void NcclEngine::fail_group_locked(std::exception_ptr error) {
  failure_->record(error, error_text(error));
  abort_communicator_locked();
  pending_cv_.notify_all(); // the watchdog fails the pending Works
}

void NcclEngine::abort_communicator_locked() noexcept {
  if (comm_ == nullptr) {
    return;
  }
  const ncclComm_t comm = comm_;
  comm_ = nullptr;
  // NCCL switches to the communicator's device itself; the guard only keeps
  // this thread's current device where it was, and failing to set it (the
  // CUDA runtime unloading at exit) must not stop the abort.
  std::optional<c10::cuda::CUDAGuard> guard;
  try {
    guard.emplace(static_cast<c10::DeviceIndex>(device_));
  } catch (...) {
  }
  const ncclResult_t result = ncclCommAbort(comm);
  if (result != ncclSuccess) {
    try {
      log_warning(c10::str(who_, " ncclCommAbort failed with ", nccl_result_text(result)));
    } catch (...) {
    }
  }
}

std::shared_ptr<Work> NcclEngine::failed_work(const std::string& name, std::chrono::milliseconds timeout,
                                              std::exception_ptr error) {
  auto work = Work::create(name, timeout);
  work->set_error(std::move(error));
  return work;
}

// ---- Launch ----------------------------------------------------------------------------------

std::shared_ptr<Work> NcclEngine::launch(NcclOp op) {
  std::unique_lock<std::mutex> lock(launch_mutex_);
  const std::string who_op = c10::str(who_, " ", op.op_name);
  DDP_CHECK(!stopping_, who_op, ": the process group is being destroyed");
  bind_device_locked(op.device, who_op);
  // See Note [NCCL fingerprint check]: none with one rank.
  uint64_t record = 0;
  const bool recorded = op.collective && recorder_ != nullptr;
  if (recorded) {
    Fingerprint described = op.fingerprint;
    described.seq = next_seq_;
    record = recorder_->queued(described);
  }
  std::unique_ptr<NcclCheck> check;
  if (op.collective && fingerprints_) {
    DDP_INTERNAL_ASSERT(op.fingerprint.op == op.op_name, "the fingerprint of ", op.op_name,
                        " names '", op.fingerprint.op, "'");
    check = std::make_unique<NcclCheck>();
    check->fingerprint = std::move(op.fingerprint);
    check->fingerprint.seq = next_seq_;
  }
  const std::string name =
      op.collective ? c10::str(who_op, " #", next_seq_++)
                    : c10::str(who_op, " ", op.peer_detail, " (point-to-point #",
                               next_point_to_point_++, ")");
  if (auto failure = failure_->message()) {
    auto error = std::make_exception_ptr(CommError(c10::str(
        name, ": not run, because the process group failed earlier and is unusable: ", with_advice(*failure))));
    if (recorded) {
      recorder_->failed(record, error, false);
    }
    return failed_work(name, op.timeout, error);
  }
  // For the error path, after `check` has moved into the Work.
  const std::optional<Fingerprint> checked =
      check ? std::optional<Fingerprint>(check->fingerprint) : std::nullopt;
  try {
    ensure_communicator(name);
    const auto device = static_cast<c10::DeviceIndex>(device_);
    c10::cuda::CUDAGuard device_guard(device);
    const c10::cuda::CUDAStream issuing = c10::cuda::getCurrentCUDAStream(device);
    const c10::cuda::CUDAStream stream = *stream_;

    // 1. The operation comes after everything queued on the caller's stream.
    ready_event_->record(issuing.stream());
    ready_event_->block(stream.stream());
    // 2. Their memory stays reserved until the communicator's stream is past
    //    this point, even if the caller drops them at once.
    for (const auto& tensor : op.tensors) {
      if (tensor.defined() && tensor.is_cuda()) {
        c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream);
      }
    }
    // 3. The fingerprint check's input, (h, -h), on the device.
    constexpr size_t kCheckBytes = 2 * sizeof(int64_t);
    std::function<void()> compare_while_stuck;
    if (check) {
      check->started = std::make_unique<CudaEvent>();
      check->started->record(stream.stream());
      if (!check_slots_) {
        check_slots_ = FingerprintSlots::create();
      }
      check->slot = check_slots_->acquire(stream);
      const int64_t hash = check->fingerprint.hash63();
      check->slot.host()[0] = hash;
      check->slot.host()[1] = -hash;
      check_cuda(cudaMemcpyAsync(check->slot.device(), check->slot.host(), kCheckBytes,
                                 cudaMemcpyHostToDevice, stream.stream()),
                 name + ": cudaMemcpyAsync (fingerprint check)");
      // NCCL may wait in ncclGroupEnd for a peer whose different call never
      // comes: compare as the watchdog does for a stalled Work.
      compare_while_stuck = [this, &fingerprint = check->fingerprint, &name,
                             next = std::chrono::steady_clock::now() + kStallDelay]() mutable {
        const auto now = std::chrono::steady_clock::now();
        if (now < next) {
          return;
        }
        next = now + kCompareInterval;
        if (auto mismatch = compare_fingerprint(fingerprint)) {
          throw CollectiveMismatchError(c10::str(name, ": ", *mismatch));
        }
      };
    }
    // 4. The NCCL calls, as one group (the check first, the same call on
    //    every rank), then any follow-up on the same stream.
    check_nccl(ncclGroupStart(), comm_, name + ": ncclGroupStart");
    try {
      if (check) {
        check_nccl(ncclAllReduce(check->slot.device(), check->slot.device(), 2, ncclInt64, ncclMax,
                                 comm_, stream.stream()),
                   comm_, name + ": ncclAllReduce (fingerprint check)");
      }
      op.issue(comm_, stream.stream(), name);
    } catch (...) {
      (void)ncclGroupEnd(); // closes the group; the error above is the one to report
      throw;
    }
    check_nccl(ncclGroupEnd(), comm_, name + ": ncclGroupEnd");
    wait_until_ready(comm_, std::chrono::steady_clock::now() + op.timeout, op.timeout, name,
                     compare_while_stuck);
    if (check) {
      // After wait_until_ready: only then is NCCL's kernel on the stream.
      check_cuda(cudaMemcpyAsync(check->slot.host(), check->slot.device(), kCheckBytes,
                                 cudaMemcpyDeviceToHost, stream.stream()),
                 name + ": cudaMemcpyAsync (fingerprint check)");
    }
    if (op.finish) {
      c10::cuda::CUDAStreamGuard stream_guard(stream);
      op.finish();
    }
    // 5. The end event, and the Work for the watchdog.
    auto work = std::make_shared<NcclWork>(name, op, device_, issuing, failure_, std::move(check));
    if (recorded) {
      recorder_->started(record); // on the GPU's queue: it runs when the stream gets there
      work->set_flight_record(recorder_, record);
    }
    work->end_event().record(stream.stream());
    work->keep_alive(std::move(op.tensors));
    {
      std::lock_guard<std::mutex> pending_lock(pending_mutex_);
      pending_.push_back(work);
    }
    pending_cv_.notify_all();
    return work;
  } catch (...) {
    // The operation may be half-queued, and the other ranks are inside it:
    // the group cannot go on. See Note [NCCL failure].
    auto error = std::current_exception();
    // A peer's different call may be why NCCL failed or kept waiting.
    if (checked && !is_mismatch(error)) {
      if (auto mismatch = compare_fingerprint(*checked)) {
        error = std::make_exception_ptr(CollectiveMismatchError(c10::str(name, ": ", *mismatch)));
      }
    }
    if (!failure_->record(error, error_text(error))) {
      // A failure came first (the watchdog aborting the communicator, which
      // this launch gave up for): that is the cause to report.
      if (auto failure = failure_->message()) {
        error = aborted_error(name, *failure);
      }
    }
    fail_group_locked(error);
    if (recorded) {
      recorder_->failed(record, error);
    }
    return failed_work(name, op.timeout, error);
  }
}

} // namespace ddp::internal
