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

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include <ddp/ddp.h>

#include "gpu/gpu_testing.h"

namespace {

constexpr int64_t kGlobalBatch = 12; // divisible by 1, 2, 3 and 4
constexpr int kSteps = 5;
constexpr double kTolerance = 1e-5;

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
}

std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  torch::manual_seed(100 + step);
  auto x = torch::randn({kGlobalBatch, 8});
  auto y = torch::randn({kGlobalBatch, 4});
  return {x, y};
}

int run(const std::string& backend_name) {
  const int devices = ddp_gpu_test::device_count();
  if (devices == 0) {
    std::printf("%s\n", ddp_gpu_test::kNoDevice);
    return ddp_gpu_test::kSkipExitCode;
  }
  const auto info = ddp::world_info_from_env();
  const bool nccl = backend_name == "nccl";
  if (nccl && devices < info.local_world_size) {
    std::printf("skipped: NCCL with %d ranks on this node needs %d GPUs, found %d\n",
                info.local_world_size, info.local_world_size, devices);
    return ddp_gpu_test::kSkipExitCode;
  }
  const int device_index = info.local_rank % devices;
  const auto device = ddp_gpu_test::cuda(device_index);
  auto group = ddp::init_process_group(
      ddp::InitOptions().backend(nccl ? ddp::Backend::kNccl : ddp::Backend::kGloo));
  const int rank = group->rank();
  const int world = group->size();
  if (kGlobalBatch % world != 0) {
    std::printf("world size %d does not divide the global batch of %lld\n", world,
                static_cast<long long>(kGlobalBatch));
    return 1;
  }

  auto reference = make_net();
  auto net = make_net();
  net->to(device);
  ddp::DistributedDataParallel model(
      net, ddp::DistributedDataParallelOptions().device_ids({device}).bucket_cap_mb(0.0001));
  torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  const int64_t per_rank = kGlobalBatch / world;
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step);
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(x), y).backward();
    reference_optimizer.step();

    optimizer.zero_grad();
    auto mine_x = x.narrow(0, rank * per_rank, per_rank).to(device);
    auto mine_y = y.narrow(0, rank * per_rank, per_rank).to(device);
    torch::mse_loss(model(mine_x), mine_y).backward();
    optimizer.step();
  }

  double worst = 0.0;
  auto expected = reference->named_parameters();
  for (const auto& p : net->named_parameters()) {
    worst = std::max(worst, (p.value().cpu() - expected[p.key()]).abs().max().item<double>());
  }
  const bool ok = worst <= kTolerance;
  std::printf("[%s] gpu ddp parity backend=%s world=%d device=cuda:%d: max |ours - reference| %.3g "
              "(tolerance %.0e)\n",
              ok ? "ok" : "FAILED", backend_name.c_str(), world, device_index, worst, kTolerance);
  ddp::destroy_process_group();
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "gloo";
  if (backend != "gloo" && backend != "nccl") {
    std::fprintf(stderr, "usage: %s gloo|nccl\n", argv[0]);
    return 2;
  }
  try {
    return run(backend);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "gpu_ddp_parity_main: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_ddp_parity_main: %s\n", e.what());
  }
  return 1;
}
