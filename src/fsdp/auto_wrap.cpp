// FullyShardedDataParallel's auto-wrap: see auto_wrap.h.

#include "fsdp/auto_wrap.h"

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <vector>

namespace ddp {

AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params) {
  return [min_num_params](const std::string&, const torch::nn::Module&, int64_t numel) {
    return numel >= min_num_params;
  };
}

namespace fsdp {

namespace {

// A unit the policy put around a child of a Sequential. A Sequential calls
// its children through torch::nn::AnyModule, which needs a forward of one
// signature: one tensor in, one out.
class AutoUnitImpl : public FsdpUnitImpl {
 public:
  explicit AutoUnitImpl(torch::nn::AnyModule module) : FsdpUnitImpl(std::move(module)) {}
  torch::Tensor forward(const torch::Tensor& input) { return FsdpUnitImpl::forward<torch::Tensor>(input); }
};

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

} // namespace

int64_t parameter_numel(const torch::nn::Module& module) {
  int64_t numel = 0;
  for (const auto& p : module.parameters()) {
    numel += p.numel();
  }
  return numel;
}

bool auto_wrap(torch::nn::Module& module, const std::string& path, const AutoWrapPolicy& policy) {
  if (dynamic_cast<FsdpUnitImpl*>(&module) != nullptr) {
    return true;
  }
  const auto children = module.named_children();
  std::vector<char> holds(children.size(), 0);
  bool any = false;
  for (size_t i = 0; i < children.size(); ++i) {
    holds[i] = auto_wrap(*children[i].value(), joined(path, children[i].key()), policy) ? 1 : 0;
    any = any || holds[i];
  }
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module);
  if (sequential == nullptr || sequential->size() != children.size()) {
    return any;
  }
  size_t i = 0;
  for (auto& entry : *sequential) {
    const auto& child = children[i];
    const std::string child_path = joined(path, child.key());
    if (!holds[i] && entry.ptr().get() == child.value().get() &&
        policy(child_path, *child.value(), parameter_numel(*child.value()))) {
      auto unit = std::make_shared<AutoUnitImpl>(entry);
      entry = torch::nn::AnyModule(unit);
      module.replace_module(child.key(), unit);
      any = true;
    }
    ++i;
  }
  return any;
}

} // namespace fsdp
} // namespace ddp
