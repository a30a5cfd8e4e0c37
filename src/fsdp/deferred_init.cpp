// Deferred construction and seeded initialisation (deferred_init.h): the
// deferred FsdpUnit's build, ddp::reset_parameters, seeded_init and
// materialize.

#include <ddp/nn/deferred_init.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>
#include <vector>

#include <ddp/nn/activation_checkpoint.h>

#include "internal/check.h"
#include "internal/hash.h"

namespace ddp {

void FsdpUnitImpl::build() {
  if (module_) {
    return;
  }
  DDP_INTERNAL_ASSERT(static_cast<bool>(factory_), "a unit with neither a module nor a factory");
  any_ = factory_();
  module_ = register_module("module", any_.ptr());
  factory_ = nullptr;
}

void FsdpUnitImpl::fail_not_built() {
  DDP_CHECK(false, "FsdpUnit: this deferred unit (ddp::deferred_unit) is not built yet: wrap the model in "
                   "FullyShardedDataParallel with FullyShardedDataParallelOptions().param_init(...), or call "
                   "ddp::materialize(model, ddp::ParamInit()...) to build it whole");
}

namespace {

// SplitMix64's finaliser: seeds that differ in one bit give unrelated
// streams.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool owns_state(const torch::nn::Module& module) {
  return !module.named_parameters(/*recurse=*/false).is_empty() || !module.named_buffers(/*recurse=*/false).is_empty();
}

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Calls fn(module, name) for `module` and every module below it, named as
// state dicts name them (a FsdpUnit's or Checkpointed's "module" adds no
// level).
void walk(torch::nn::Module& module, const std::string& name,
          const std::function<void(torch::nn::Module&, const std::string&)>& fn) {
  fn(module, name);
  const bool transparent = dynamic_cast<FsdpUnitImpl*>(&module) != nullptr ||
                           dynamic_cast<CheckpointedImpl*>(&module) != nullptr;
  for (const auto& child : module.named_children()) {
    walk(*child.value(), transparent && child.key() == "module" ? name : joined(name, child.key()), fn);
  }
}

// Initialises one module: on the CPU, from the default CPU generator seeded
// for it.
void init_one(torch::nn::Module& module, const std::string& name, const ParamInit& options) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, c10::Device>> moved;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    if (!item.value().device().is_cpu()) {
      moved.emplace_back(item.value(), item.value().device());
      item.value().set_data(item.value().to(at::kCPU));
    }
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    if (!item.value().device().is_cpu()) {
      moved.emplace_back(item.value(), item.value().device());
      item.value().set_data(item.value().to(at::kCPU));
    }
  }
  // The draws lock the generator themselves: it is locked only around
  // setting its state.
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
    generator.set_current_seed(mix(options.seed() ^ mix(internal::fnv1a(name))));
  }
  auto restore = [&] {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
  };
  try {
    options.init()(module, name);
  } catch (...) {
    restore();
    throw;
  }
  restore();
  for (auto& [tensor, device] : moved) {
    tensor.set_data(tensor.to(device));
  }
}

} // namespace

void reset_parameters(torch::nn::Module& module, const std::string& path) {
  namespace nn = torch::nn;
  if (auto* m = dynamic_cast<nn::LinearImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::BilinearImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::Conv1dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::Conv2dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::Conv3dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::ConvTranspose1dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::ConvTranspose2dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::ConvTranspose3dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::EmbeddingImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::EmbeddingBagImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::LayerNormImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::GroupNormImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::BatchNorm1dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::BatchNorm2dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::BatchNorm3dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::InstanceNorm1dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::InstanceNorm2dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::InstanceNorm3dImpl*>(&module)) {
    m->reset_parameters();
  } else if (auto* m = dynamic_cast<nn::PReLUImpl*>(&module)) {
    m->weight.fill_(m->options.init());
  } else {
    DDP_CHECK(module.named_parameters(/*recurse=*/false).is_empty(), "ddp::reset_parameters: module '", path,
              "' (", module.name(), ") holds parameters and is of no type whose initialisation LibTorch defines; "
              "pass a ModuleInit that initialises it (ParamInit().init(...))");
  }
}

void seeded_init(torch::nn::Module& module, const ParamInit& options, const std::string& prefix) {
  walk(module, prefix, [&](torch::nn::Module& m, const std::string& name) {
    if (owns_state(m)) {
      init_one(m, name, options);
    }
  });
}

void materialize(torch::nn::Module& module, const ParamInit& options) {
  std::vector<FsdpUnitImpl*> built;
  walk(module, "", [&](torch::nn::Module& m, const std::string&) {
    auto* unit = dynamic_cast<FsdpUnitImpl*>(&m);
    if (unit != nullptr && !unit->built()) {
      unit->build();
      built.push_back(unit);
    }
  });
  seeded_init(module, options);
  for (auto* unit : built) {
    unit->module()->to(options.device());
  }
}

} // namespace ddp
