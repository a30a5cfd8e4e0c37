// Failures of the MPI backend, in real processes under mpirun: a stuck
// collective and a killed rank must end the job, never hang it.
//
// Usage (run_mpi_failure_test.sh checks the outcome, mpi.cmake registers it):
//   DDP_BACKEND=mpi mpirun -np 2 build/tests/mpi_failure_main stuck-destroy
//     rank 1 never joins an allreduce with a 1000 ms deadline; rank 0 prints
//     the TimeoutError and the error of a later collective, then destroys the
//     group, which ends the job with MPI_Abort (exit code non-zero).
//   ... mpi_failure_main stuck-exit
//     the same, but rank 0 returns from main with the group still alive: the
//     exit handler ends the job.
//   ... mpi_failure_main kill
//     rank 1 kills itself (SIGKILL) while rank 0 waits in an allreduce;
//     mpirun ends the job.
//   WORLD_SIZE=2 RANK=0 DDP_BACKEND=mpi build/tests/mpi_failure_main init
//     outside an MPI launcher: init_process_group's error says what to do.
// Each line it prints starts with "mpi_failure_main: [rank R] ".

#include <ATen/ATen.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <ddp/ddp.h>

namespace {

void say(int rank, const std::string& text) {
  std::printf("mpi_failure_main: [rank %d] %s\n", rank, text.c_str());
  std::fflush(stdout);
}

int stuck(bool destroy) {
  auto pg = ddp::init_process_group();
  const int rank = pg->rank();
  pg->barrier()->wait();
  if (rank == 1) {
    // Never joins: sleeps far past the deadline and the test's limit.
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  auto t = at::ones({16});
  const auto start = std::chrono::steady_clock::now();
  try {
    pg->allreduce(t, {ddp::ReduceOp::kSum, std::chrono::milliseconds(1000)})->wait();
    say(rank, "ERROR: the allreduce completed without rank 1");
    return 3;
  } catch (const ddp::TimeoutError& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    say(rank, std::string("caught TimeoutError after ") + std::to_string(waited.count()) +
                  " ms: " + e.what());
  }
  try {
    pg->broadcast(t)->wait(std::chrono::milliseconds(100));
    say(rank, "ERROR: a collective after the timeout completed");
    return 3;
  } catch (const ddp::TimeoutError& e) {
    say(rank, std::string("ERROR: the later collective waited instead of failing: ") + e.what());
    return 3;
  } catch (const ddp::CommError& e) {
    say(rank, std::string("later collective failed at once: ") + e.what());
  }
  pg.reset();
  if (destroy) {
    say(rank, "destroying the group");
    ddp::destroy_process_group(); // ends the job: the allreduce is still inside MPI
    say(rank, "ERROR: destroy_process_group returned");
    return 3;
  }
  say(rank, "returning from main with the group alive");
  return 0; // the exit handler ends the job
}

int kill_rank_1() {
  auto pg = ddp::init_process_group();
  const int rank = pg->rank();
  auto t = at::ones({1 << 16});
  pg->allreduce(t)->wait();
  if (rank == 1) {
    say(rank, "killing myself");
    ::kill(::getpid(), SIGKILL);
  }
  say(rank, "entering an allreduce that rank 1 will never join");
  pg->allreduce(t)->wait(); // mpirun ends the job first
  say(rank, "ERROR: the allreduce completed");
  return 3;
}

int init_only() {
  auto pg = ddp::init_process_group();
  say(pg->rank(), "ERROR: init_process_group succeeded");
  return 3;
}

} // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "stuck-destroy" || mode == "stuck-exit") {
      return stuck(mode == "stuck-destroy");
    }
    if (mode == "kill") {
      return kill_rank_1();
    }
    if (mode == "init") {
      return init_only();
    }
    std::fprintf(stderr, "usage: mpi_failure_main stuck-destroy|stuck-exit|kill|init\n");
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "mpi_failure_main: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_failure_main: %s\n", e.what());
    return 1;
  }
}
