#pragma once

// The MPI library's process-wide state (private header): initialising it
// once, finalising it at exit, ending the job when a collective is stuck,
// and turning MPI error codes into our errors.
//
// How it works. MPI may be initialised once per process and finalised once,
// and every rank must finalise before it exits or the launcher reports the
// job as failed. The first ProcessGroupMPI calls `ensure_mpi_initialized`,
// which calls MPI_Init_thread (unless the program already did) and registers
// an atexit handler. At exit that handler first shuts down every group
// still alive (`MpiExitHook`: their workers finish or, if a collective is
// stuck past its deadline, the job is aborted), then finalises MPI. Groups
// destroyed earlier shut themselves down and leave the registry. A program
// that initialised MPI itself also finalises it itself; ddp then only
// checks, before each MPI call it makes on the way out, that MPI is not
// finalised yet.
//
// MPI cannot cancel a collective, so a collective that is stuck inside MPI
// past its deadline can only end with the job: `abort_job` prints why and
// calls MPI_Abort, which makes the launcher stop every rank.

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <string>
#include <vector>

namespace ddp::internal::mpi {

// Where this process stands in MPI_COMM_WORLD.
struct MpiWorld {
  int rank = 0;
  int size = 1;
};

// Initialises MPI with MPI_THREAD_MULTIPLE unless it is initialised already
// (by us or by the program), and returns this process's place in
// MPI_COMM_WORLD. Thread-safe. Throws c10::Error when MPI was finalised,
// or when the library cannot give MPI_THREAD_MULTIPLE (each group's worker
// thread calls MPI concurrently with the others and with send/recv on the
// caller's thread). `who` ("ProcessGroupMPI") starts the messages.
MpiWorld ensure_mpi_initialized(const std::string& who);

// True once MPI_Finalize has been called (by us or by the program). After
// it, no MPI call may be made.
bool mpi_finalized();

// What a group does when the process exits while it is still alive; see the
// narrative at the top of this file.
class MpiExitHook {
 public:
  // Finishes the group's work and releases its MPI resources, or ends the
  // job when a collective is stuck. Called once, from the exit handler,
  // before MPI_Finalize. Must not throw.
  virtual void shutdown_at_exit() noexcept = 0;

 protected:
  ~MpiExitHook() = default;
};

// A group registers itself while it is alive. `hook` must stay valid until
// it unregisters; unregistering waits for an exit handler that is running
// the hook.
void register_exit_hook(MpiExitHook* hook);
void unregister_exit_hook(MpiExitHook* hook);

// Takes over a point-to-point request whose Work was destroyed before it
// completed: `keep` (the buffer's tensors) stays alive until MPI is done
// with it. Completed requests are released at the next adoption; at exit the
// pending ones are cancelled and freed before MPI_Finalize. Thread-safe.
void adopt_request(MPI_Request request, std::vector<at::Tensor> keep);

// Prints `why` to stderr and calls MPI_Abort on MPI_COMM_WORLD, which ends
// every rank of the job. Never returns.
[[noreturn]] void abort_job(const std::string& why) noexcept;

// MPI's text for an error code.
std::string error_string(int code);

// Throws CommError "<what>: <MPI's text> (MPI error code N)" unless `code`
// is MPI_SUCCESS.
void check_mpi(int code, const std::string& what);

} // namespace ddp::internal::mpi
