// The install test's program: built against an installed ddp, it meets the
// other ranks and checks one allreduce.
//
// Usage (run by tests/install/run_install_test.sh):
//   <prefix>/bin/ddprun --nproc-per-node 2 ./consumer
// prints, on each rank,
//   [rank 1]: consumer: rank 1 of 2: allreduce sum 3 (expected 1 + ... + 2 = 3): OK
// and run alone, as a world of size 1,
//   consumer: rank 0 of 1: allreduce sum 1 (expected 1 + ... + 1 = 1): OK
// It exits with status 1 when the sum is wrong or anything throws.

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>

#include <ddp/ddp.h>

int main() {
  try {
    // env:// as set by ddprun; with no launcher variables, a world of size 1.
    auto pg = ddp::init_process_group();
    const int rank = pg->rank();
    const int world = pg->size();

    // Rank r contributes r + 1, so the sum is W(W+1)/2 in closed form.
    auto tensor = at::full({3}, static_cast<double>(rank + 1), at::kDouble);
    pg->allreduce(tensor)->wait();
    const double expected = world * (world + 1) / 2.0;
    const bool ok = at::equal(tensor, at::full({3}, expected, at::kDouble));

    std::printf("consumer: rank %d of %d: allreduce sum %g (expected 1 + ... + %d = %g): %s\n",
                rank, world, tensor[0].item<double>(), world, expected, ok ? "OK" : "WRONG");
    std::fflush(stdout);
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
