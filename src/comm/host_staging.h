#pragma once

// CUDA tensors through host memory, for the Gloo and MPI backends (private
// header): both move host memory (a CUDA-aware MPI could take device
// pointers, but whether one is depends on how it was built). For CPU
// tensors both classes do nothing.
//
// Note [Gloo and CUDA streams]
// A caller may still have kernels queued that write a CUDA tensor when it
// issues a collective, on any stream, including the non-blocking streams of
// LibTorch's pool that do not synchronise with the default stream. So at
// enqueue, on the caller's thread, `StreamFence::record` records an event on
// the current stream of every device that the task's tensors live on, and
// the worker makes its own current stream wait for those events (`wait`)
// before its first staging copy. The copies back to the device are
// synchronous (pinned host to device, then the stream is synchronised), and
// the Work completes only after them, so a caller that waits on the Work
// before its next use of the tensors sees the result from any stream.

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace ddp::internal {

// Events on the caller's streams. Thread-safety: recorded on the caller's
// thread, waited on by the worker; not shared otherwise.
class StreamFence {
 public:
  static StreamFence record(const std::vector<at::Tensor>& tensors) {
    StreamFence fence;
    for (const auto& t : tensors) {
      if (!t.defined() || !t.is_cuda()) {
        continue;
      }
      const auto device = t.device();
      if (std::any_of(fence.events_.begin(), fence.events_.end(),
                      [&](const auto& e) { return e.first == device; })) {
        continue;
      }
      const c10::impl::VirtualGuardImpl impl(device.type());
      auto event = std::make_unique<c10::Event>(device.type());
      event->record(impl.getStream(device));
      fence.events_.emplace_back(device, std::move(event));
    }
    return fence;
  }

  void wait() const {
    for (const auto& [device, event] : events_) {
      const c10::impl::VirtualGuardImpl impl(device.type());
      event->block(impl.getStream(device));
    }
  }

 private:
  std::vector<std::pair<c10::Device, std::unique_ptr<c10::Event>>> events_;
};

// Host copies of CUDA tensors for one task; lives on the worker thread.
class HostStaging {
 public:
  // The host tensor to hand to the backend in place of `tensor`; `tensor` itself
  // when it is on the CPU.
  at::Tensor in(const at::Tensor& tensor) {
    auto host = read(tensor);
    if (tensor.is_cuda()) {
      pairs_.emplace_back(tensor, host);
    }
    return host;
  }

  // A host copy of `tensor` that the backend only reads: not written back.
  // `tensor` itself when it is on the CPU.
  at::Tensor read(const at::Tensor& tensor) const {
    if (!tensor.is_cuda()) {
      return tensor;
    }
    auto host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
    host.copy_(tensor);
    return host;
  }

  // A host buffer for `tensor` that the backend only writes: not copied from
  // the device, written back by copy_back(). `tensor` itself when it is on
  // the CPU.
  at::Tensor write(const at::Tensor& tensor) {
    if (!tensor.is_cuda()) {
      return tensor;
    }
    auto host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
    pairs_.emplace_back(tensor, host);
    return host;
  }

  // Writes every staged host tensor back to its device tensor.
  void copy_back() {
    for (auto& [device, host] : pairs_) {
      device.copy_(host);
    }
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs_;
};

} // namespace ddp::internal
