// One rank of the flight recorder's fault cases (flight_recorder_cases.sh),
// started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT and no
// launcher (Gloo), or by mpirun with DDP_BACKEND=mpi; with
// DDP_FLIGHT_RECORDER_DIR set.
//
// Usage: flight_recorder_main <mode> <timeout seconds>
//   Every rank runs allreduce #0 .. #4 of 4 floats, then:
//   skip  rank 1 skips allreduce #5: it prints "flight_recorder: rank 1
//         idle (pid P)" and sleeps until it is killed; rank 0 calls #5 and
//         waits
//   size  rank 1 calls allreduce #5 with 8 floats, rank 0 with 4
//   ok    every rank calls #5 alike, then writes its dump with
//         ddp::dump_flight_recorder("done")
//   loop  every rank prints "flight_recorder: rank R looping (pid P)" and
//         runs allreduces of 64 Ki floats until one fails (the script kills
//         or stops a rank); with DDP_TEST_GIVE_UP=R, rank R instead writes
//         its dump and exits 3 after 20 of them
// Each rank prints "flight_recorder: rank R completed" (exit 0) or
// "flight_recorder: rank R caught: <first line>" (exit 3).

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <ddp/ddp.h>

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  if (argc != 3) {
    std::fprintf(stderr, "usage: flight_recorder_main skip|size|ok|loop <timeout seconds>\n");
    return 2;
  }
  const std::string mode = argv[1];
  const char* rank_text = std::getenv("RANK");
  if (rank_text == nullptr) {
    rank_text = std::getenv("OMPI_COMM_WORLD_RANK");
  }
  const int rank = rank_text == nullptr ? -1 : std::atoi(rank_text);
  try {
    auto group = ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(std::atoi(argv[2]))));
    for (int i = 0; i < 5; ++i) {
      group->allreduce(torch::ones({4}))->wait();
    }
    if (mode == "skip" && rank == 1) {
      std::printf("flight_recorder: rank 1 idle (pid %d)\n", static_cast<int>(::getpid()));
      std::fflush(stdout);
      for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
    if (mode == "loop") {
      const char* give_up = std::getenv("DDP_TEST_GIVE_UP");
      std::printf("flight_recorder: rank %d looping (pid %d)\n", rank, static_cast<int>(::getpid()));
      std::fflush(stdout);
      for (int i = 0; i < 1000000; ++i) {
        if (give_up != nullptr && std::atoi(give_up) == rank && i == 20) {
          ddp::dump_flight_recorder("giving up");
          std::printf("flight_recorder: rank %d gives up\n", rank);
          return 3;
        }
        group->allreduce(torch::ones({1 << 16}))->wait();
      }
    }
    const int64_t n = mode == "size" && rank == 1 ? 8 : 4;
    group->allreduce(torch::ones({n}))->wait();
    if (mode == "ok") {
      const std::string path = ddp::dump_flight_recorder("done");
      std::printf("flight_recorder: rank %d dumped to %s\n", rank, path.c_str());
    }
    ddp::destroy_process_group();
    std::printf("flight_recorder: rank %d completed\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::string message = e.what();
    message = message.substr(0, message.find('\n'));
    std::printf("flight_recorder: rank %d caught: %s\n", rank, message.c_str());
    std::fflush(stdout);
    return 3;
  }
}
