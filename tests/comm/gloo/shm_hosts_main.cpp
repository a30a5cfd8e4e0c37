// One rank of a Gloo job for tests/comm/gloo/shm_hosts.sh, which starts the
// ranks in network namespaces (hosts) of their own: init_process_group from
// the environment, then allreduces of a buffer from allocate_collective_buffer
// and of private tensors. Arguments: "shared" when the
// buffers must be in shared memory (the same number of ranks on every host),
// "private" when they must not be. Exits 0 when every check holds, else
// prints what failed and exits 1.

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <ddp/comm/process_group_gloo.h>
#include <ddp/init.h>

namespace {

int failures = 0;

void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "shm_hosts_main: rank %d: FAILED: %s\n", rank, what.c_str());
    ++failures;
  }
}

} // namespace

int main(int argc, char** argv) {
  const bool want_shared = argc > 1 && std::strcmp(argv[1], "shared") == 0;
  torch::set_num_threads(1);
  auto group = ddp::init_process_group(ddp::InitOptions().backend(ddp::Backend::kGloo));
  auto* gloo = dynamic_cast<ddp::ProcessGroupGloo*>(group.get());
  if (gloo == nullptr) {
    std::fprintf(stderr, "shm_hosts_main: the default group is not a ProcessGroupGloo\n");
    return 1;
  }
  auto& pg = *gloo;
  const int rank = pg.rank();
  const int world = pg.size();
  const int64_t count = 300001;
  auto buffer = pg.allocate_collective_buffer(count, torch::kDouble);
  check(pg.is_shared_buffer(buffer) == want_shared,
        want_shared ? "the buffer is not in shared memory" : "the buffer is in shared memory", rank);
  // Integer values: every order of summation gives the same sum.
  const auto input = torch::arange(count, torch::kDouble).remainder(1000) * (rank + 1);
  const double factor = world * (world + 1) / 2.0;
  for (auto op : {ddp::ReduceOp::kSum, ddp::ReduceOp::kMax, ddp::ReduceOp::kAvg}) {
    buffer.copy_(input);
    pg.allreduce(buffer, {op})->wait();
    auto reference = input.clone();
    pg.allreduce(reference, {op})->wait();
    const auto base = torch::arange(count, torch::kDouble).remainder(1000);
    const auto expected = op == ddp::ReduceOp::kSum ? base * factor
                          : op == ddp::ReduceOp::kMax ? base * world
                                                       : base * factor / world;
    check(torch::equal(buffer, expected), "allreduce " + ddp::to_string(op) + " of the buffer", rank);
    check(torch::equal(reference, expected), "allreduce " + ddp::to_string(op) + " of a private tensor", rank);
  }
  // Bits the same on every rank: gather rank 0's result of an inexact sum.
  buffer.copy_(torch::sin(torch::arange(count, torch::kDouble) * (rank + 1)));
  pg.allreduce(buffer)->wait();
  auto from_zero = buffer.clone();
  pg.broadcast(from_zero, {0})->wait();
  check(torch::equal(from_zero, buffer), "ranks hold different bits after an inexact sum", rank);
  const auto stats = pg.shared_memory_stats();
  check((stats.allreduces > 0) == want_shared,
        "shared-memory allreduces: " + std::to_string(stats.allreduces), rank);
  std::printf("shm_hosts_main: rank %d of %d: %s buffers, %lld allreduces in shared memory, %s\n", rank,
              world, pg.is_shared_buffer(buffer) ? "shared" : "private",
              static_cast<long long>(stats.allreduces), failures == 0 ? "ok" : "FAILED");
  group.reset();
  ddp::destroy_process_group();
  return failures == 0 ? 0 : 1;
}
