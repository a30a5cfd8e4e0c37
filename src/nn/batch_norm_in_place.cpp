// BatchNorms that convert_sync_batchnorm synchronises where they stand.
//
// Note [BatchNorms synchronised in place]
// A custom module that holds a BatchNorm as its own member
// (`torch::nn::BatchNorm2d bn;`, as PyTorch's C++ DCGAN example holds
// them) calls it from its forward through that typed member, and
// BatchNorm's forward is not virtual: no module put in its place would ever
// run. What that forward does run is the operator `aten::batch_norm`,
// through the dispatcher, with the layer's own weight and running mean. So
// such a layer stays where it is, and its training forwards are taken at
// the dispatcher: the hook is a kernel of `aten::batch_norm` under a
// dispatch key of higher priority than autograd, TESTING_ONLY_GenericMode
// (a "mode" key that PyTorch keeps for this kind of interception and uses
// only in its own tests), falling through for every other operator; the
// key is switched on in the thread-local dispatch state of the thread that
// converts and of every DistributedDataParallel and FullyShardedDataParallel
// forward, which the autograd engine carries into backward (an activation
// checkpoint's recomputation included). The kernel looks the call's weight
// (or, without one, running mean) up among the registered layers; for a
// registered layer in training mode, with a group of more than one rank,
// it runs SyncBatchNorm's training forward (sync_batch_norm.cpp), with the
// momentum factor BatchNorm's forward has just computed (it has already
// counted the batch in num_batches_tracked); everything else goes on to
// ATen's batch_norm unchanged. The registry holds the layers weakly and
// checks, at each call, that the layer still holds the tensor it is known
// by, so that a freed tensor's address never stands for another layer.
// The layer keeps its type and name: its checkpoints, printing and
// parameters are a BatchNorm's.

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <torch/nn/modules/batchnorm.h>

#include <atomic>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <ddp/init.h>

#include "internal/check.h"
#include "nn/sync_batch_norm_internal.h"

namespace ddp::nn::detail {
namespace in_place {

constexpr c10::DispatchKey kHookKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// The tensors a layer is known by.
struct Identity {
  at::Tensor weight;
  at::Tensor running_mean;
};

template <typename Impl>
Identity identity_as(const torch::nn::Module& module) {
  const auto& batch_norm = dynamic_cast<const Impl&>(module); // Module is a virtual base
  return {batch_norm.weight, batch_norm.running_mean};
}

// What a layer is known by, and how to read it again; nullptr: not a
// BatchNorm.
using IdentityReader = Identity (*)(const torch::nn::Module&);

IdentityReader reader_for(const torch::nn::Module& module) {
  if (dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr) {
    return &identity_as<torch::nn::BatchNorm1dImpl>;
  }
  if (dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr) {
    return &identity_as<torch::nn::BatchNorm2dImpl>;
  }
  if (dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr) {
    return &identity_as<torch::nn::BatchNorm3dImpl>;
  }
  return nullptr;
}

// The tensor a layer's calls are known by: its weight, or without one its
// running mean (BatchNorm passes both to batch_norm).
const c10::TensorImpl* key_of(const Identity& identity) {
  if (identity.weight.defined()) {
    return identity.weight.unsafeGetTensorImpl();
  }
  return identity.running_mean.defined() ? identity.running_mean.unsafeGetTensorImpl() : nullptr;
}

struct Layer {
  std::weak_ptr<torch::nn::Module> module;
  IdentityReader read = nullptr;
  std::shared_ptr<ProcessGroup> group; // nullptr: the default group
  std::string name;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Layer> layers;
};

Registry& registry() {
  static auto* instance = new Registry(); // outlives every module (never destroyed)
  return *instance;
}

std::atomic<bool> any_registered{false};

// The registered layer that this call of batch_norm is for, with the
// module kept alive for the call; `found` false when none.
struct Found {
  bool found = false;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<ProcessGroup> group;
  std::string name;
};

Found find_layer(const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& running_mean) {
  const Identity called{weight.value_or(at::Tensor()), running_mean.value_or(at::Tensor())};
  const c10::TensorImpl* key = key_of(called);
  if (key == nullptr) {
    return {};
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.layers.find(key);
  if (it == r.layers.end()) {
    return {};
  }
  auto module = it->second.module.lock();
  if (!module) {
    r.layers.erase(it); // the layer is gone; its tensor's address may be another's now
    return {};
  }
  if (key_of(it->second.read(*module)) != key) {
    return {}; // the layer holds other tensors now; this one is not its
  }
  return {true, std::move(module), it->second.group, it->second.name};
}

at::Tensor batch_norm_hook(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                           const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& running_mean,
                           const c10::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
                           bool cudnn_enabled) {
  c10::impl::ExcludeDispatchKeyGuard below(kHookKey);
  if (training) {
    Found layer = find_layer(weight, running_mean);
    // As PyTorch's SyncBatchNorm: only a layer in training mode
    // synchronises (without running statistics BatchNorm passes
    // training=true in eval mode too).
    if (layer.found && layer.module->is_training()) {
      auto group = layer.group ? layer.group : default_process_group();
      if (group->size() > 1) {
        return sync_batch_norm_training(input, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()),
                                        running_mean.value_or(at::Tensor()), running_var.value_or(at::Tensor()),
                                        momentum, eps, std::move(group), layer.name);
      }
    }
  }
  return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled);
}

// The dispatcher's registrations, made once and kept for the process's
// life (dropping them at exit could run after the dispatcher is gone).
struct Hook {
  std::unique_ptr<torch::Library> fallthrough;
  std::unique_ptr<torch::Library> kernel;
};

std::mutex hook_mutex;
Hook* installed = nullptr;

} // namespace in_place

void install_batch_norm_hook(const std::string& name) {
  using namespace in_place;
  std::lock_guard<std::mutex> lock(hook_mutex);
  if (installed != nullptr) {
    return;
  }
  auto hook = std::make_unique<Hook>();
  try {
    hook->fallthrough =
        std::make_unique<torch::Library>(torch::Library::IMPL, "_", kHookKey, __FILE__, __LINE__);
    hook->fallthrough->fallback(torch::CppFunction::makeFallthrough());
    hook->kernel = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", kHookKey, __FILE__, __LINE__);
    hook->kernel->impl("batch_norm", TORCH_FN(batch_norm_hook));
  } catch (const c10::Error& e) {
    DDP_CHECK(false, "convert_sync_batchnorm: '", name,
              "' is a BatchNorm held as a custom module's member, which is synchronised where it stands "
              "through a dispatcher hook on TESTING_ONLY_GenericMode, and that hook could not be installed "
              "(another library in this process uses the key?): ",
              e.what_without_backtrace(),
              ". Declare the member as ddp::nn::SyncBatchNorm, or hold the layer in a Sequential, "
              "ModuleList or ModuleDict");
  }
  installed = hook.release();
}

bool can_synchronise_in_place(const torch::nn::Module& batch_norm) {
  const auto read = in_place::reader_for(batch_norm);
  return read != nullptr && in_place::key_of(read(batch_norm)) != nullptr;
}

void synchronise_in_place(const std::shared_ptr<torch::nn::Module>& batch_norm, std::shared_ptr<ProcessGroup> group,
                          const std::string& name) {
  using namespace in_place;
  const auto read = reader_for(*batch_norm);
  DDP_INTERNAL_ASSERT(read != nullptr && key_of(read(*batch_norm)) != nullptr, "'", name,
                      "' cannot be synchronised in place");
  install_batch_norm_hook(name);
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto it = r.layers.begin(); it != r.layers.end();) {
      it = it->second.module.expired() ? r.layers.erase(it) : std::next(it);
    }
    auto& layer = r.layers[key_of(read(*batch_norm))];
    // Converted again: the group may change; the first name stays (a layer
    // registered twice is named by its first path, as SyncBatchNorm's).
    const bool same_layer = layer.module.lock() == batch_norm;
    layer.module = batch_norm;
    layer.read = read;
    layer.group = std::move(group);
    if (!same_layer) {
      layer.name = name;
    }
  }
  any_registered = true;
  c10::impl::tls_set_dispatch_key_included(kHookKey, true);
}

void enable_batch_norms_in_place() {
  if (in_place::any_registered.load(std::memory_order_relaxed)) {
    c10::impl::tls_set_dispatch_key_included(in_place::kHookKey, true);
  }
}

} // namespace ddp::nn::detail
