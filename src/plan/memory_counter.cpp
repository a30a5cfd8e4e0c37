#include "plan/memory_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "internal/torch_compat.h"

namespace ddp::internal {
namespace {

// Note [Counting tensor memory]
// A plan's peak memory (docs/scaling.md) is the most bytes of CPU tensors
// this process held at once: what the model, its gradients, the optimizer's
// state, DDP's buckets, FSDP's gathered units and the activations take, the
// same figure in a fake run and in a real one. LibTorch allocates every CPU
// tensor's storage through the allocator registered for the CPU, so one
// placed in front of it sees them all: it asks the allocator it replaced
// for the memory, keeps what it got (and its size) by address, and hands
// out a DataPtr whose deleter counts the bytes back and lets the allocator
// behind free them. Memory that is not a tensor's (LibTorch's and Gloo's
// own buffers, the program's code) is not counted; the process's peak
// resident set is reported beside it.
// The buffers the Gloo and MPI backends put in shared memory for DDP's
// buckets (src/comm/shm/) are mapped, not allocated: they count themselves
// (count_tensor_bytes_outside_allocator), as the fake group, which has no
// such memory, leaves those buckets to the allocator.
// CUDA tensors go through CUDA's allocator and are not counted here.

std::atomic<int64_t> g_bytes{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_window_peak{0}; // since start_new_peak_window()

// The memory handed out and not yet given back, by address: what the
// allocator behind gave (freed by its own deleter when the entry goes) and
// its size. The DataPtrs handed out keep the address as their context, as
// LibTorch's own CPU allocator does, so that raw_allocate and
// raw_deallocate, and the checks that a storage is "simple", hold.
struct Entry {
  at::DataPtr memory;
  int64_t bytes = 0;
};
std::mutex g_mutex;
std::unordered_map<void*, Entry>& live() {
  static auto* entries = new std::unordered_map<void*, Entry>(); // never freed: see release()
  return *entries;
}

// Runs whenever a counted tensor's storage goes, possibly while statics are
// being destroyed at exit: nothing it touches is ever destroyed.
void release(void* data) {
  Entry entry;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto found = live().find(data);
    if (found == live().end()) {
      return; // not ours: cannot happen, as only our DataPtrs carry this deleter
    }
    entry = std::move(found->second);
    live().erase(found);
  }
  g_bytes.fetch_sub(entry.bytes, std::memory_order_relaxed);
  // `entry` goes here: the allocator behind frees the memory.
}

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

class CountingAllocator final : public at::Allocator {
 public:
  explicit CountingAllocator(at::Allocator* inner) : inner_(inner) {}

  at::DataPtr allocate(size_t n) DDP_ALLOCATOR_ALLOCATE_CONST override {
    at::DataPtr memory = inner_->allocate(n);
    void* data = memory.get();
    if (data == nullptr) {
      return memory; // nothing allocated (n == 0)
    }
    const at::Device device = memory.device();
    const auto bytes = static_cast<int64_t>(n);
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      live()[data] = Entry{std::move(memory), bytes};
    }
    const int64_t now = g_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise_to(g_peak, now);
    raise_to(g_window_peak, now);
    return at::DataPtr(data, data, &release, device);
  }

  at::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

#if DDP_TORCH_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  at::Allocator* inner_;
};

std::atomic<bool> g_counting{false};

} // namespace

void start_counting_cpu_tensor_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never freed: tensors counted by it may outlive every static.
    static auto* counter = new CountingAllocator(c10::GetCPUAllocator());
    // A priority above the default CPU allocator's (0), which it wraps.
    c10::SetCPUAllocator(counter, /*priority=*/50);
    g_counting.store(true);
  });
}

bool count_tensor_bytes_outside_allocator(int64_t delta) {
  if (!g_counting.load()) {
    return false;
  }
  const int64_t now = g_bytes.fetch_add(delta, std::memory_order_relaxed) + delta;
  raise_to(g_peak, now);
  raise_to(g_window_peak, now);
  return true;
}

bool counting_cpu_tensor_memory() {
  return g_counting.load();
}

int64_t cpu_tensor_bytes() {
  return g_bytes.load(std::memory_order_relaxed);
}

int64_t peak_cpu_tensor_bytes() {
  return g_peak.load(std::memory_order_relaxed);
}

int64_t peak_in_window() {
  return g_window_peak.load(std::memory_order_relaxed);
}

int64_t start_new_peak_window() {
  return g_window_peak.exchange(g_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

} // namespace ddp::internal
