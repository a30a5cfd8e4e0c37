#pragma once

// Helpers of the GPU tests (tests/gpu): skipping without a device, keeping a
// stream busy, and fresh NCCL groups.

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <type_traits>

#include <ddp/comm/process_group_nccl.h>
#include <ddp/ddp.h>
#include <ddp/init.h>
#include <ddp/store/hash_store.h>

namespace ddp_gpu_test {

// What every GPU test prints when it skips for want of a device.
constexpr const char* kNoDevice = "no CUDA device: NCCL tests need a GPU";

// Exit code of a GPU test program that skips (SKIP_RETURN_CODE in CTest).
constexpr int kSkipExitCode = 77;

inline int device_count() {
  return static_cast<int>(c10::cuda::device_count());
}

// Skips the current test unless `needed` CUDA devices are present.
#define DDP_REQUIRE_GPUS(needed)                                                           \
  do {                                                                                     \
    if (::ddp_gpu_test::device_count() == 0) {                                             \
      GTEST_SKIP() << ::ddp_gpu_test::kNoDevice;                                           \
    }                                                                                      \
    if (::ddp_gpu_test::device_count() < (needed)) {                                       \
      GTEST_SKIP() << "this test needs " << (needed) << " CUDA devices, found "            \
                   << ::ddp_gpu_test::device_count();                                      \
    }                                                                                      \
  } while (false)

inline torch::Device cuda(int index = 0) {
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// Queues a kernel that spins for at least `duration` on the current stream
// of `device`. clock64() ticks at most at the peak clock that the device
// reports, so the spin lasts at least that long.
inline void keep_stream_busy(std::chrono::milliseconds duration, int device = 0) {
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) != cudaSuccess || khz <= 0) {
    khz = 2'000'000; // 2 GHz: no GPU clocks faster
  }
  at::cuda::sleep(static_cast<int64_t>(khz) * duration.count());
}

// True while work queued on the current stream of `device` has not finished.
inline bool stream_busy(int device = 0) {
  const auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  const cudaError_t status = cudaStreamQuery(stream.stream());
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return true;
  }
  return false;
}

// A group name no other group of this process has used.
inline std::string fresh_group_name() {
  static std::atomic<int> counter{0};
  return "gpu-test-" + std::to_string(counter++);
}

// A world of one NCCL rank over an in-memory store.
inline std::shared_ptr<ddp::ProcessGroupNCCL> make_nccl_group_of_one(
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return ddp::ProcessGroupNCCL::create(
      std::make_shared<ddp::HashStore>(), 0, 1,
      ddp::ProcessGroupNCCLOptions().timeout(timeout).group_name(fresh_group_name()).device_index(0));
}

// A rank of a parity program under a launcher: its GPU, cuda:LOCAL_RANK
// modulo the devices, and the default group of `backend` ("gloo" or
// "nccl").
struct LaunchedRank {
  torch::Device device;
  std::shared_ptr<ddp::ProcessGroup> group;
};

// Global batches are split evenly between the ranks.
constexpr int64_t kGlobalBatch = 12; // divisible by 1, 2, 3 and 4

// Starts this rank of a parity program; nullopt, after saying why, when the
// program must skip (exit with kSkipExitCode): no device, or NCCL with fewer
// GPUs than ranks on this node (NCCL drives one GPU per process; Gloo ranks
// may share one). Throws when the world size does not divide kGlobalBatch.
inline std::optional<LaunchedRank> launch_rank(const std::string& backend) {
  const int devices = device_count();
  if (devices == 0) {
    std::printf("%s\n", kNoDevice);
    return std::nullopt;
  }
  const auto info = ddp::world_info_from_env();
  const bool nccl = backend == "nccl";
  if (nccl && devices < info.local_world_size) {
    std::printf("skipped: NCCL with %d ranks on this node needs %d GPUs, found %d\n", info.local_world_size,
                info.local_world_size, devices);
    return std::nullopt;
  }
  auto group =
      ddp::init_process_group(ddp::InitOptions().backend(nccl ? ddp::Backend::kNccl : ddp::Backend::kGloo));
  TORCH_CHECK(kGlobalBatch % group->size() == 0, "world size ", group->size(),
              " does not divide the global batch of ", kGlobalBatch);
  return LaunchedRank{cuda(info.local_rank % devices), std::move(group)};
}

// The main() of a parity program: `run(backend)` with the backend named by
// the first argument (gloo by default); 2 on a bad argument, 1 when `run`
// throws (saying what, after `program`).
template <typename Run>
int parity_main(int argc, char** argv, const char* program, Run&& run) {
  const std::string backend = argc > 1 ? argv[1] : "gloo";
  if (backend != "gloo" && backend != "nccl") {
    std::fprintf(stderr, "usage: %s gloo|nccl\n", argv[0]);
    return 2;
  }
  try {
    return run(backend);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
  }
  return 1;
}

// Step `step`'s global batch of the parity programs: kGlobalBatch samples
// of 8 inputs and 4 targets, the same on every rank.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  torch::manual_seed(100 + step);
  auto x = torch::randn({kGlobalBatch, 8});
  auto y = torch::randn({kGlobalBatch, 4});
  return {x, y};
}

// Trains, for `steps` steps, `reference` on the CPU on each step's whole
// global batch and `model` (DDP over `net`, on `device`) on this rank's
// slice of it, each with its optimizer and the MSE loss; returns the largest
// difference between the parameters of `net` and of `reference`. Throws when
// a parameter of `net` left `device`.
inline double train_against_cpu(torch::nn::Sequential& reference, torch::optim::Optimizer& reference_optimizer,
                                ddp::DistributedDataParallel& model, torch::nn::Sequential& net,
                                torch::optim::Optimizer& optimizer, const torch::Device& device, int rank,
                                int world, int steps) {
  const int64_t per_rank = kGlobalBatch / world;
  for (int64_t step = 0; step < steps; ++step) {
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
    TORCH_CHECK(p.value().device() == device, p.key(), " left ", device, " for ", p.value().device());
    worst = std::max(worst, (p.value().cpu() - expected[p.key()]).abs().max().item<double>());
  }
  return worst;
}

// The message of the exception `fn` throws: its text when it is an
// `Exception`, else a text saying what it was instead.
template <typename Exception, typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    if (const auto* expected = dynamic_cast<const Exception*>(&e)) {
      if constexpr (std::is_base_of_v<c10::Error, Exception>) {
        return expected->what_without_backtrace();
      } else {
        return expected->what();
      }
    }
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
      return std::string("<c10::Error, not the expected type>: ") + c10_error->what_without_backtrace();
    }
    return std::string("<unexpected exception type>: ") + e.what();
  }
  return "<no exception>";
}

} // namespace ddp_gpu_test
