// One rank of the start-up exit sweep (tests/comm/init_exit_sweep.sh),
// started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT and no
// launcher. DDP_TEST_INIT_EXIT_AT=<point>:<rank> stops that rank at a point
// of init_process_group (Note [Start-up exit points]) or, for the points
// first-collective and ddp, here: before its first allreduce, or before it
// constructs DistributedDataParallel. INIT_EXIT_TIMEOUT_S: the group's
// timeout (default 4 s).
//
// Every rank prints one line and exits:
//   init_exit: rank R completed            (exit 0: nobody stopped)
//   init_exit: rank R caught: <message>    (exit 3: the error, caught)
// The stopped rank exits 86 without a word. A rank that dies of
// std::terminate (SIGABRT) or hangs is what the sweep looks for.

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <ddp/ddp.h>

namespace {

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? -1 : std::atoi(value);
}

void exit_point(const char* point, int rank) {
  const char* chosen = std::getenv("DDP_TEST_INIT_EXIT_AT");
  if (chosen != nullptr && std::string(chosen) == std::string(point) + ":" + std::to_string(rank)) {
    std::fflush(nullptr);
    std::_Exit(86);
  }
}

// INIT_EXIT_WAIT_FOR=<file> (set, not empty): wait (at most 60 s) until <file> exists before
// init_process_group, so that a test can start a rank early, while the
// others load, and let it join at a moment of its choosing
// (rendezvous_progress.sh: a process's start-up takes seconds on a loaded
// machine, under ASan more).
void wait_for_go_file() {
  const char* path = std::getenv("INIT_EXIT_WAIT_FOR");
  if (path == nullptr || *path == '\0') {
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::access(path, F_OK) != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("init_exit: %s did not appear within 60 s\n", path);
      std::exit(4);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

} // namespace

int main() {
  torch::set_num_threads(1);
  const int rank = env_int("RANK");
  wait_for_go_file();
  try {
    // The sweep's deadline is short; INIT_EXIT_TIMEOUT_S lengthens it for
    // the start-up of a large world on few cores (docs/reliability.md).
    const int timeout_s = env_int("INIT_EXIT_TIMEOUT_S") > 0 ? env_int("INIT_EXIT_TIMEOUT_S") : 4;
    auto group = ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(timeout_s)));
    exit_point("first-collective", rank);
    auto ones = torch::ones({4});
    group->allreduce(ones)->wait();
    exit_point("ddp", rank);
    torch::nn::Linear net(4, 2);
    ddp::DistributedDataParallel model(net);
    model(torch::ones({2, 4})).sum().backward();
    ddp::destroy_process_group();
    std::printf("init_exit: rank %d completed\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::string message = e.what();
    message = message.substr(0, message.find('\n'));
    std::printf("init_exit: rank %d caught: %s\n", rank, message.c_str());
    std::fflush(stdout);
    return 3;
  }
}
