// DistributedSampler's defaults read from a real default process group.
// The two-rank case forks: the default group is one per process, so ranks
// cannot be threads here. Each process rendezvous over env://
// (init_process_group) on a free local port.

#include <ddp/data/distributed_sampler.h>
#include <ddp/init.h>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "testing/free_port.h"

namespace ddp {
namespace {

using testing::free_port;

void set_launcher_env(int rank, int world_size, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

void clear_launcher_env() {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                           "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    ::unsetenv(name);
  }
}

// Joins a world of two as `rank` and checks a default-built sampler against
// one given that placement explicitly. Returns "" or what went wrong.
std::string run_rank(int rank, int port) {
  set_launcher_env(rank, /*world_size=*/2, port);
  std::string failure;
  try {
    init_process_group(
        InitOptions().backend(Backend::kGloo).timeout(std::chrono::seconds(30)));
    const DistributedSampler sampler(11, DistributedSamplerOptions().seed(5));
    const DistributedSampler expected(
        11, DistributedSamplerOptions().num_replicas(2).rank(rank).seed(5));
    if (sampler.num_replicas() != 2 || sampler.rank() != rank) {
      failure = "rank " + std::to_string(rank) + ": sampler has num_replicas " +
          std::to_string(sampler.num_replicas()) + " and rank " +
          std::to_string(sampler.rank()) + ", expected 2 and " +
          std::to_string(rank);
    } else if (sampler.epoch_indices() != expected.epoch_indices()) {
      failure = "rank " + std::to_string(rank) +
          ": indices differ from an explicitly placed sampler";
    }
    destroy_process_group();
  } catch (const std::exception& e) {
    failure = "rank " + std::to_string(rank) + ": " + e.what();
  }
  clear_launcher_env();
  return failure;
}

TEST(DistributedSamplerGroupTest, DefaultsToAWorldOfOneWithoutAGroup) {
  ASSERT_FALSE(is_initialized());
  const DistributedSampler sampler(10);
  EXPECT_EQ(sampler.num_replicas(), 1);
  EXPECT_EQ(sampler.rank(), 0);
  EXPECT_EQ(sampler.num_samples(), 10u);
}

TEST(DistributedSamplerGroupTest, DefaultsComeFromTheDefaultGroup) {
  ASSERT_FALSE(is_initialized());
  const int port = free_port();
  ASSERT_GT(port, 0) << "could not find a free port";
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    const std::string failure = run_rank(1, port);
    if (!failure.empty()) {
      std::fprintf(stderr, "%s\n", failure.c_str());
    }
    std::fflush(stderr);
    ::_exit(failure.empty() ? 0 : 1);
  }
  const std::string failure = run_rank(0, port);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(failure, "");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "rank 1 (the child) failed; see its stderr above";
  EXPECT_FALSE(is_initialized());
}

} // namespace
} // namespace ddp
