// ZeroRedundancyOptimizer on CUDA parameters against one CPU process: W
// ranks, each training a CUDA replica under DDP on its slice of a global
// batch with ZeRO<Adam> (stage 1, stage 1 overlapped with backward, stage 2
// overlapped, stage 1 with parameters as bucket views), must end with the
// parameters that a plain Adam on the CPU gets on the whole batch.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/gpu_zero_parity_main gloo
//   build/ddprun --nproc-per-node 1 build/tests/gpu_zero_parity_main nccl
// prints one line per case on each rank
//   [ok] gpu zero parity backend=gloo world=2 device=cuda:0 stage 2, overlapped: max |ours - reference| 3e-08
// then "gpu_zero_parity_main (rank R of W): N of N cases passed"; exits 1 when
// a case fails, 77 (a skip for CTest) without a CUDA device or when NCCL is
// asked for with fewer GPUs than ranks on this node.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "gpu/gpu_testing.h"

namespace {

constexpr int kSteps = 6;
constexpr double kTolerance = 1e-5;

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 4));
}

struct Case {
  std::string name;
  int stage;
  bool overlap;
  bool bucket_view;
};

// One case: returns the largest parameter difference to the CPU reference.
double run_case(const Case& c, const torch::Device& device, int rank, int world) {
  auto reference = make_net();
  auto net = make_net();
  net->to(device);
  // Tiny buckets: several buckets, so that overlapped steps run during backward.
  ddp::DistributedDataParallel model(net, ddp::DistributedDataParallelOptions()
                                              .device_ids({device})
                                              .first_bucket_cap_mb(0.0001)
                                              .bucket_cap_mb(0.0001));
  torch::optim::Adam reference_optimizer(reference->parameters(), torch::optim::AdamOptions(1e-2));
  ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> zero(
      net->parameters(), torch::optim::AdamOptions(1e-2),
      ddp::optim::ZeroRedundancyOptimizerOptions().stage(c.stage).parameters_as_bucket_view(c.bucket_view));
  if (c.overlap) {
    zero.overlap_with(model);
  }
  return ddp_gpu_test::train_against_cpu(reference, reference_optimizer, model, net, zero, device, rank, world,
                                         kSteps);
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
  const std::vector<Case> cases = {{"stage 1", 1, false, false},
                                   {"stage 1, overlapped", 1, true, false},
                                   {"stage 2, overlapped", 2, true, false},
                                   {"stage 1, parameters as bucket views", 1, false, true}};
  int passed = 0;
  for (const auto& c : cases) {
    std::string failure;
    double worst = 0.0;
    try {
      worst = run_case(c, device, rank, world);
    } catch (const c10::Error& e) {
      failure = e.what_without_backtrace();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    const bool ok = failure.empty() && worst <= kTolerance;
    passed += ok ? 1 : 0;
    if (failure.empty()) {
      std::printf("[%s] gpu zero parity backend=%s world=%d device=cuda:%d %s: max |ours - reference| "
                  "%.3g (tolerance %.0e)\n",
                  ok ? "ok" : "FAILED", backend_name.c_str(), world, device_index, c.name.c_str(), worst,
                  kTolerance);
    } else {
      std::printf("[FAILED] gpu zero parity backend=%s world=%d %s: %s\n", backend_name.c_str(), world,
                  c.name.c_str(), failure.c_str());
    }
  }
  std::printf("gpu_zero_parity_main (rank %d of %d): %d of %zu cases passed\n", rank, world, passed,
              cases.size());
  ddp::destroy_process_group();
  return passed == static_cast<int>(cases.size()) ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return ddp_gpu_test::parity_main(argc, argv, "gpu_zero_parity_main", run);
}
