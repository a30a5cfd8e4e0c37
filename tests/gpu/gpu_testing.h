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

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

#include <ddp/store/hash_store.h>
#include <ddp/comm/process_group_nccl.h>

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
