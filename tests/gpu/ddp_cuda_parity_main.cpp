// DistributedDataParallel on CUDA against one CPU process: W ranks, each
// training a CUDA replica on its slice of a global batch, must end with the
// parameters that plain training on the CPU gets on the whole batch.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/gpu_ddp_parity_main gloo
//   build/ddprun --nproc-per-node 2 build/tests/gpu_ddp_parity_main nccl
// prints on each rank
//   [ok] gpu ddp parity backend=gloo world=2 device=cuda:0: max |ours - reference| 2.4e-08
// and exits 0; exits 1 when a parameter differs, and 77 (a skip for CTest)
// when there is no CUDA device ("no CUDA device: NCCL tests need a GPU"), or
// when NCCL is asked for with fewer GPUs than ranks on this node (NCCL drives
// one GPU per process; Gloo ranks may share one).
//
// Every rank also trains the CPU reference itself, from the same seeded
// weights and batches: no files are exchanged.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <string>

#include <ddp/ddp.h>

#include "gpu/gpu_testing.h"

namespace {

constexpr int kSteps = 5;
constexpr double kTolerance = 1e-5;

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
}

int run(const std::string& backend_name) {
  const auto launched = ddp_gpu_test::launch_rank(backend_name);
  if (!launched) {
    return ddp_gpu_test::kSkipExitCode;
  }
  const auto device = launched->device;
  const int device_index = device.index();
  const int rank = launched->group->rank();
  const int world = launched->group->size();

  auto reference = make_net();
  auto net = make_net();
  net->to(device);
  ddp::DistributedDataParallel model(
      net, ddp::DistributedDataParallelOptions().device_ids({device}).bucket_cap_mb(0.0001));
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  const double worst = ddp_gpu_test::train_against_cpu(reference, reference_optimizer, model, net, optimizer,
                                                       device, rank, world, kSteps);
  const bool ok = worst <= kTolerance;
  std::printf("[%s] gpu ddp parity backend=%s world=%d device=cuda:%d: max |ours - reference| %.3g "
              "(tolerance %.0e)\n",
              ok ? "ok" : "FAILED", backend_name.c_str(), world, device_index, worst, kTolerance);
  ddp::destroy_process_group();
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return ddp_gpu_test::parity_main(argc, argv, "gpu_ddp_parity_main", run);
}
