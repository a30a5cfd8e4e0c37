#include "testing/multi_rank.h"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <ddp/comm/error.h>
#include <ddp/store/file_store.h>
#include <ddp/store/hash_store.h>
#include <ddp/comm/process_group_gloo.h>

namespace ddp::testing {

namespace {
const char* const kRunIdKey = "testing/run_id";

std::string next_run_id() {
  static std::atomic<int> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter++);
}
} // namespace

void run_threads(int world_size,
                 const std::function<void(int rank, std::shared_ptr<Store> store)>& fn) {
  auto store = std::make_shared<HashStore>(std::chrono::seconds(60));
  store->set(kRunIdKey, next_run_id());
  std::mutex mutex;
  std::exception_ptr first_error;
  int failed_rank = -1;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank, store);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) {
          first_error = std::current_exception();
          failed_rank = rank;
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  if (first_error) {
    try {
      std::rethrow_exception(first_error);
    } catch (const std::exception& e) {
      throw std::runtime_error("rank " + std::to_string(failed_rank) + " failed: " + e.what());
    }
  }
}

std::shared_ptr<ProcessGroup> make_gloo_group(std::shared_ptr<Store> store, int rank,
                                              int world_size, std::chrono::milliseconds timeout) {
  // Each run records its own id in its store (see run_threads/run_processes),
  // so that groups of runs with different world sizes in one test process
  // never share a name.
  const std::string name = "test-run-" + store->get_string(kRunIdKey);
  return ProcessGroupGloo::create(
      std::move(store), rank, world_size,
      ProcessGroupGlooOptions().timeout(timeout).hostname("127.0.0.1").group_name(name));
}

std::shared_ptr<ProcessGroup> make_gloo_group_of_one() {
  auto store = std::make_shared<HashStore>();
  store->set(kRunIdKey, next_run_id());
  return make_gloo_group(std::move(store), 0, 1);
}

namespace {
std::string fresh_path() {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ddp_test_store_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter++);
}
} // namespace

std::vector<ProcessResult> run_processes(
    int world_size, const std::function<int(int rank, std::shared_ptr<Store> store)>& fn,
    std::chrono::milliseconds deadline) {
  const std::string path = fresh_path();
  FileStore(path).set(kRunIdKey, next_run_id());
  std::fflush(nullptr);
  std::vector<pid_t> pids(world_size);
  std::vector<int> pipes(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) {
      throw std::runtime_error("pipe failed");
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      ::close(fds[0]);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[1]);
      // The parent may have run OpenMP regions; a forked child that enters
      // one again with a thread pool hangs. One thread avoids the pool.
      at::set_num_threads(1);
      int code = 1;
      try {
        auto store = std::make_shared<FileStore>(path, std::chrono::seconds(30));
        code = fn(rank, store);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: exception: %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    pids[rank] = pid;
    pipes[rank] = fds[0];
  }

  std::vector<ProcessResult> results(world_size);
  std::vector<bool> done(world_size, false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  int remaining = world_size;
  auto drain = [&](int rank) {
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(pipes[rank], buffer, sizeof(buffer))) > 0) {
      results[rank].output.append(buffer, static_cast<size_t>(n));
    }
  };
  while (remaining > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      drain(rank);
      if (done[rank]) {
        continue;
      }
      int status = 0;
      if (::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        done[rank] = true;
        --remaining;
        if (WIFEXITED(status)) {
          results[rank].exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          results[rank].signal = WTERMSIG(status);
        }
      }
    }
    if (std::chrono::steady_clock::now() > end) {
      for (int rank = 0; rank < world_size; ++rank) {
        if (!done[rank]) {
          ::kill(pids[rank], SIGKILL);
          ::waitpid(pids[rank], nullptr, 0);
          results[rank].timed_out = true;
          done[rank] = true;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < world_size; ++rank) {
    drain(rank);
    ::close(pipes[rank]);
  }
  std::remove(path.c_str());
  return results;
}

ProcessGroupGloo& as_gloo(const std::shared_ptr<ProcessGroup>& pg) {
  return dynamic_cast<ProcessGroupGloo&>(*pg);
}

int survivor_outcome(int rank, int killed, const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  try {
    body();
  } catch (const RemoteError& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "rank %d after %.2f s: %s\n", rank, seconds, e.what());
    if (seconds >= 10) {
      return kNoticedLate;
    }
    return std::string(e.what()).find("rank " + std::to_string(killed)) != std::string::npos
        ? kSawRemoteErrorNamingIt
        : kSurvivorSawOtherError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return kSurvivorSawOtherError;
  }
  return kSurvivorSawNoError;
}

} // namespace ddp::testing
