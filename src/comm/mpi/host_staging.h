#pragma once

// CUDA tensors through host memory, for the MPI backend (private header).
//
// MPI moves host memory here (a CUDA-aware MPI could take device pointers,
// but whether one is depends on how it was built, and the Gloo backend's
// staging has the ordering worked out). The order is that of Note [Gloo and
// CUDA streams] in src/comm/gloo/process_group_gloo.cpp: at issue time, on
// the caller's thread, `StreamFence::record` records an event on the current
// stream of each device the operation's tensors live on; the worker makes
// its own current stream wait for those events before its first copy to the
// host, and copies results back synchronously before the Work completes.
// For CPU tensors both classes do nothing.

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace ddp::internal::mpi {

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
  // The host tensor to hand to MPI in place of `tensor`; `tensor` itself
  // when it is on the CPU.
  at::Tensor in(const at::Tensor& tensor) {
    if (!tensor.is_cuda()) {
      return tensor;
    }
    auto host = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
    host.copy_(tensor);
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

} // namespace ddp::internal::mpi
