// The fake backend's shared buffers: Note [Shared buffers in the fake]
// (fake_shared_buffers.h).

#include "comm/fake/fake_shared_buffers.h"

#include <cstdlib>
#include <set>

#include "internal/check.h"
#include "internal/env.h"
#include "plan/memory_counter.h"

namespace ddp::internal {
namespace {

// ProcessGroupGlooOptions::shared_memory_min_bytes' default.
constexpr int64_t kSharedMinBytes = 65536;

} // namespace

std::unique_ptr<FakeSharedBuffers> FakeSharedBuffers::from_env(const std::string& who, int per_host) {
  const std::string value = env_get(kEnvFakeShm).value_or("0");
  DDP_CHECK(value == "0" || value == "1", who, " ", kEnvFakeShm.name, " must be 0 or 1 (got '", value,
            "'): 1 shares buffers among the ranks of a host as Gloo does, 0 shares none");
  if (value == "0") {
    return nullptr;
  }
  if (per_host <= 0) {
    const auto local = env_get(kEnvLocalWorldSize);
    DDP_CHECK(local.has_value(), who, " ", kEnvFakeShm.name,
              "=1 needs the ranks per host: set LOCAL_WORLD_SIZE (ddprun --plan does) or DDP_FAKE_LINK's per_host");
    char* end = nullptr;
    const long parsed = std::strtol(local->c_str(), &end, 10);
    DDP_CHECK(!local->empty() && *end == '\0' && parsed >= 1, who, " ", kEnvFakeShm.name,
              "=1: LOCAL_WORLD_SIZE must be a whole number >= 1 (got '", *local, "')");
    per_host = static_cast<int>(parsed);
  }
  return std::make_unique<FakeSharedBuffers>(per_host);
}

FakeSharedBuffers::FakeSharedBuffers(int per_host)
    : per_host_(per_host), registry_(std::make_shared<Registry>()) {}

bool FakeSharedBuffers::shares(const std::vector<int>& members) const {
  // As src/comm/shm/shared_buffers.cpp's learn_hosts decides.
  std::map<int, int> on_host;
  for (const int rank : members) {
    on_host[rank / per_host_] += 1;
  }
  if (on_host.size() == 1) {
    return true;
  }
  const int first = on_host.begin()->second;
  for (const auto& host : on_host) {
    if (host.second != first || first < 2) {
      return false;
    }
  }
  return true;
}

bool FakeSharedBuffers::on_one_host(const std::vector<int>& members) const {
  std::set<int> hosts;
  for (const int rank : members) {
    hosts.insert(rank / per_host_);
  }
  return hosts.size() == 1;
}

bool FakeSharedBuffers::large_enough(int64_t numel, const at::TensorOptions& options) {
  return options.device().is_cpu() && numel > 0 &&
         numel * static_cast<int64_t>(options.dtype().itemsize()) >= kSharedMinBytes;
}

at::Tensor FakeSharedBuffers::allocate(int64_t numel, const at::TensorOptions& options, int64_t counted_bytes) {
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  // calloc: zeros, paged in as they are touched, as a fresh mapping is.
  auto* base = static_cast<uint8_t*>(std::calloc(bytes, 1));
  DDP_CHECK(base != nullptr, "fake group: cannot allocate a buffer of ", bytes, " bytes");
  const bool counted = count_tensor_bytes_outside_allocator(counted_bytes);
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    registry_->bytes_at.emplace(base, bytes);
  }
  std::shared_ptr<Registry> registry = registry_;
  return at::from_blob(
      base, {numel},
      [registry, counted, counted_bytes](void* data) {
        if (counted) {
          count_tensor_bytes_outside_allocator(-counted_bytes);
        }
        {
          std::lock_guard<std::mutex> lock(registry->mutex);
          registry->bytes_at.erase(static_cast<const uint8_t*>(data));
        }
        std::free(data);
      },
      options.device(at::kCPU));
}

bool FakeSharedBuffers::contains(const at::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.has_storage()) {
    return false;
  }
  const auto* data = static_cast<const uint8_t*>(tensor.data_ptr());
  std::lock_guard<std::mutex> lock(registry_->mutex);
  auto it = registry_->bytes_at.upper_bound(data);
  if (it == registry_->bytes_at.begin()) {
    return false;
  }
  --it;
  return data < it->first + it->second;
}

} // namespace ddp::internal
