// The smallest ddp program: meet the other ranks and sum a tensor.
//
// Usage:
//   build/ddprun --nproc-per-node 4 build/examples/allreduce_example
// prints, on each of the 4 ranks,
//   [rank 2]: rank 2 of 4: allreduce gave 10 (expected 1 + 2 + ... + 4 = 10): OK
// Run with no launcher, it is a world of size 1 and prints
//   rank 0 of 1: allreduce gave 1 (expected 1 + 2 + ... + 1 = 1): OK
// It exits with status 1 if the sum is wrong.

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>

#include <ddp/ddp.h>

int main() {
  try {
    // Reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (set by ddprun);
    // with none of them set, forms a world of size 1.
    auto pg = ddp::init_process_group();
    const int rank = pg->rank();
    const int world = pg->size();

    auto tensor = at::full({4}, rank + 1.0);
    pg->allreduce(tensor)->wait();

    const double expected = world * (world + 1) / 2.0;
    const bool ok = at::equal(tensor, at::full({4}, expected));
    std::printf("rank %d of %d: allreduce gave %g (expected 1 + 2 + ... + %d = %g): %s\n", rank,
                world, tensor[0].item<double>(), world, expected, ok ? "OK" : "WRONG");
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_example: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
