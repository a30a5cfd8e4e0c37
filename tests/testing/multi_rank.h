#pragma once

// The multi-rank test harness (Gloo's base_test.h `spawn`, and
// multiproc_test.h, in our terms).
//
// - `run_threads` runs one function per rank on threads over one HashStore:
//   fast, for unit tests of collectives.
// - `run_processes` forks one process per rank over a FileStore: for crash,
//   signal and timeout tests, where a rank must die or hang on its own.
// Integration tests run real programs under ddprun (tests/integration).

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/comm/process_group_gloo.h>
#include <ddp/store/store.h>

#include "testing/free_port.h" // free_port(), which the harness's users need

namespace ddp::testing {

// Runs fn(rank, store) on `world_size` threads sharing one HashStore; joins
// all, then rethrows the first exception (prefixed with its rank).
void run_threads(int world_size,
                 const std::function<void(int rank, std::shared_ptr<Store> store)>& fn);

// A Gloo group on loopback with a group name unique to this test process.
// `store` comes from run_threads or run_processes, which record the run's id
// in it.
std::shared_ptr<ProcessGroup> make_gloo_group(
    std::shared_ptr<Store> store, int rank, int world_size,
    std::chrono::milliseconds timeout = std::chrono::seconds(30));

// A Gloo group of one rank over a fresh HashStore, outside run_threads.
std::shared_ptr<ProcessGroup> make_gloo_group_of_one();

// A group from make_gloo_group, as what it is (for its Gloo-only methods).
ProcessGroupGloo& as_gloo(const std::shared_ptr<ProcessGroup>& pg);

// What happened to one forked rank.
struct ProcessResult {
  int exit_code = -1; // when it exited normally, else -1
  int signal = 0;     // the signal that killed it, else 0
  bool timed_out = false; // killed by the harness at the deadline
  std::string output; // what it wrote to stderr and stdout
};

// Forks `world_size` processes; each runs fn(rank, store) over a fresh
// FileStore and exits with its return value (1 and a message on an
// exception). Kills any rank still running at `deadline`.
std::vector<ProcessResult> run_processes(
    int world_size,
    const std::function<int(int rank, std::shared_ptr<Store> store)>& fn,
    std::chrono::milliseconds deadline);

// How a rank that outlives a killed peer ended, as its exit code for
// run_processes: `survivor_outcome` runs `body` (collectives that the kill
// breaks) and returns kSawRemoteErrorNamingIt for a RemoteError that names
// "rank <killed>" within 10 s, kNoticedLate for one after that,
// kSawOtherError for any other error (printed), kNoError if none came.
constexpr int kSawRemoteErrorNamingIt = 11;
constexpr int kSurvivorSawOtherError = 12;
constexpr int kSurvivorSawNoError = 13;
constexpr int kNoticedLate = 14;
int survivor_outcome(int rank, int killed, const std::function<void()>& body);

} // namespace ddp::testing
