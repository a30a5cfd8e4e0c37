// Our side of the parity test against PyTorch's DistributedDataParallel
// (tests/nn/pytorch_parity_driver.py runs it and pytorch_ddp_reference.py,
// which trains the same models on the same data with torch.nn.parallel,
// and compares what rank 0 of each wrote).
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/ddp_pytorch_parity_main OUT_PREFIX
// trains each configuration below for 5 steps of SGD (lr 0.2, momentum
// 0.5) on rank slices of the closed-form data, and on rank 0 writes the
// final parameters to OUT_PREFIX.<configuration>.txt (one "name values..."
// line each). Exits 1 on an error.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <string>

#include <ddp/ddp.h>

#include "nn/closed_form.h"

namespace {

constexpr int kSteps = 5;

// Must match pytorch_ddp_reference.py.
template <typename Net>
bool train_and_write(Net net, const ddp::DistributedDataParallelOptions& options,
                     const std::string& path) {
  auto group = ddp::default_process_group();
  ddp_test::init_closed_form(*net);
  ddp::DistributedDataParallel model(net, options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.2).momentum(0.5));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group->rank(), group->size());
    optimizer.zero_grad();
    torch::mse_loss(model(x), y).backward();
    optimizer.step();
  }
  if (group->rank() == 0) {
    if (!ddp_test::write_state_text(*net, path)) {
      std::fprintf(stderr, "ddp_pytorch_parity_main: cannot write %s\n", path.c_str());
      return false;
    }
    std::printf("wrote %s\n", path.c_str());
  }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ddp_pytorch_parity_main OUT_PREFIX\n");
    return 2;
  }
  const std::string prefix = argv[1];
  try {
    ddp::init_process_group();
    bool ok = train_and_write(ddp_test::make_mlp(), {}, prefix + ".mlp.txt");
    ok = ok && train_and_write(ddp_test::BranchNet(),
                               ddp::DistributedDataParallelOptions()
                                   .find_unused_parameters(true)
                                   .gradient_as_bucket_view(true),
                               prefix + ".branch.txt");
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_pytorch_parity_main: %s\n", e.what());
    return 1;
  }
}
