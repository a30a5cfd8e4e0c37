#include "comm/mpi/mpi_runtime.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include <ddp/comm/error.h>

#include "comm/slurm_env.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::internal::mpi {

namespace {

// A request whose Work is gone, and the tensors it reads or writes.
struct Orphan {
  MPI_Request request;
  std::vector<at::Tensor> keep;
};

// Thread-safety: every field is guarded by `mutex`. While the exit handler
// runs the hooks (without holding the mutex, since a hook may end up
// destroying another group), a group destroyed on another thread waits in
// unregister_exit_hook, so that it is not freed under the handler.
struct Runtime {
  ~Runtime();

  std::mutex mutex;
  std::condition_variable hooks_done;
  bool initialized_by_us = false;
  std::vector<MpiExitHook*> hooks; // null: unregistered while the hooks ran
  bool running_hooks = false;
  std::thread::id hooks_thread;
  std::vector<Orphan> orphans;
};

// Set when the Runtime is destroyed at exit. Groups held by static objects
// constructed before it (the default group's slot in init.cpp is one) are
// destroyed after it, and must then find nothing to unregister from. An
// atomic bool is constant-initialised and trivially destructible, so it can
// still be read then.
std::atomic<bool> runtime_destroyed{false};

Runtime::~Runtime() {
  runtime_destroyed = true;
}

Runtime& runtime() {
  // Constructed before the exit handler is registered, so destroyed after it
  // runs ([basic.start.term]).
  static Runtime state;
  return state;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown level";
  }
}

// Runs at exit when ddp initialised MPI: see the narrative in the header.
void finalize_at_exit() {
  Runtime& state = runtime();
  std::unique_lock<std::mutex> lock(state.mutex);
  state.running_hooks = true;
  state.hooks_thread = std::this_thread::get_id();
  for (size_t i = 0; i < state.hooks.size(); ++i) {
    MpiExitHook* hook = state.hooks[i];
    if (hook != nullptr) {
      lock.unlock();
      hook->shutdown_at_exit(); // ends the job instead of returning when a collective is stuck
      lock.lock();
    }
  }
  state.hooks.clear();
  state.running_hooks = false;
  state.hooks_done.notify_all();
  if (mpi_finalized()) {
    return; // the program finalised MPI itself
  }
  for (Orphan& orphan : state.orphans) {
    int done = 0;
    MPI_Test(&orphan.request, &done, MPI_STATUS_IGNORE);
    if (!done) {
      // A receive that never matched, or a send that nobody received: the
      // program dropped its Work, so nobody wants the data any more.
      MPI_Cancel(&orphan.request);
      MPI_Request_free(&orphan.request);
    }
  }
  MPI_Finalize();
  state.orphans.clear(); // the tensors outlive MPI's last use of them
}

} // namespace

MpiWorld ensure_mpi_initialized(const std::string& who) {
  DDP_CHECK(!runtime_destroyed, who, ": the process is exiting; MPI is finalised");
  Runtime& state = runtime();
  std::lock_guard<std::mutex> lock(state.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  DDP_CHECK(!finalized, who,
            ": MPI was finalised (MPI_Finalize) in this process, and MPI can be "
            "initialised only once per process: create MPI groups before MPI_Finalize");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // A failing MPI_Init aborts the process with the MPI library's own
    // message: say first what is likely wrong.
    if (const std::string warning = srun_without_pmix_warning(); !warning.empty()) {
      log_warning(who + ": " + warning);
    }
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    DDP_CHECK(rc == MPI_SUCCESS, who, ": MPI_Init_thread failed: ", error_string(rc));
    state.initialized_by_us = true;
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  DDP_CHECK(provided >= MPI_THREAD_MULTIPLE, who, ": the MPI library gives thread level ",
            thread_level_name(provided),
            ", but the MPI backend needs MPI_THREAD_MULTIPLE (each group's worker thread calls MPI "
            "while send/recv and other groups do too). ",
            state.initialized_by_us
                ? "Use an MPI built with thread support (Open MPI has it by default since 3.0)."
                : "The program initialised MPI itself: call MPI_Init_thread with MPI_THREAD_MULTIPLE.");
  MpiWorld world;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  return world;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

void register_exit_hook(MpiExitHook* hook) {
  if (runtime_destroyed) {
    return; // exiting; see runtime_destroyed
  }
  Runtime& state = runtime();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.hooks.push_back(hook);
}

void unregister_exit_hook(MpiExitHook* hook) {
  if (runtime_destroyed) {
    return; // the exit handler ran and the registry is gone
  }
  Runtime& state = runtime();
  std::unique_lock<std::mutex> lock(state.mutex);
  if (state.running_hooks && state.hooks_thread != std::this_thread::get_id()) {
    state.hooks_done.wait(lock, [&state] { return !state.running_hooks; });
  }
  // While the hooks run (on this thread: a hook destroyed this group), the
  // handler's loop indexes the list, so the entry is nulled, not erased.
  std::replace(state.hooks.begin(), state.hooks.end(), hook, static_cast<MpiExitHook*>(nullptr));
  if (!state.running_hooks) {
    state.hooks.erase(std::remove(state.hooks.begin(), state.hooks.end(), nullptr), state.hooks.end());
  }
}

void adopt_request(MPI_Request request, std::vector<at::Tensor> keep) {
  if (runtime_destroyed) {
    return; // MPI is finalised: the request is gone with it
  }
  Runtime& state = runtime();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (mpi_finalized()) {
    return;
  }
  auto& orphans = state.orphans;
  orphans.erase(std::remove_if(orphans.begin(), orphans.end(),
                               [](Orphan& orphan) {
                                 int done = 0;
                                 MPI_Test(&orphan.request, &done, MPI_STATUS_IGNORE);
                                 return done != 0;
                               }),
                orphans.end());
  orphans.push_back(Orphan{request, std::move(keep)});
}

void abort_job(const std::string& why) noexcept {
  std::fprintf(stderr, "%s\n", why.c_str());
  std::fflush(stderr);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized && !mpi_finalized()) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::abort(); // MPI_Abort does not return; without MPI, end this process at least
}

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return c10::str("MPI error code ", code);
  }
  return c10::str(std::string(text, static_cast<size_t>(length)), " (MPI error code ", code, ")");
}

void check_mpi(int code, const std::string& what) {
  if (code != MPI_SUCCESS) {
    throw CommError(c10::str(what, ": ", error_string(code)));
  }
}

} // namespace ddp::internal::mpi
