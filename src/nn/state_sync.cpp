// Note [Buffers of a live graph]: a forward may save a buffer for its
// backward (BatchNorm saves its running statistics), and a second forward
// before that backward broadcasts the buffers again. An ordinary in-place
// copy would bump their version counters, and the first backward would then
// refuse to run ("modified by an inplace operation"), as in PyTorch 1.13 and
// 2.11 (PyTorch issue 175024; the fix proposed there keeps the version
// counters as they were, like kPreserve here). With kPreserve the values are
// written through `variable_data()`, an alias of the same storage with a
// version counter of its own. The saved graph then reads the broadcast
// values; for BatchNorm in training mode, whose backward uses the batch
// statistics it saved rather than the running ones, the gradients are the
// same.

#include "nn/state_sync.h"

#include <ATen/ATen.h>

#include <map>
#include <tuple>

namespace ddp::internal {

void broadcast_coalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                         VersionCounters versions) {
  if (group.size() == 1 || tensors.empty()) {
    return;
  }
  at::NoGradGuard no_grad;
  // Group by (dtype, device) in a deterministic order.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), static_cast<int>(t.device().type()),
            static_cast<int>(t.device().index())}]
        .push_back(t);
  }
  for (auto& [key, members] : groups) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : members) {
      flat_parts.push_back(t.detach().reshape({-1}));
    }
    auto flat = at::cat(flat_parts);
    group.broadcast(flat, {root})->wait();
    int64_t offset = 0;
    for (const auto& t : members) {
      // detach() shares the version counter; variable_data() does not.
      auto target = versions == VersionCounters::kPreserve ? t.variable_data() : t.detach();
      target.view({-1}).copy_(flat.narrow(0, offset, t.numel()));
      offset += t.numel();
    }
  }
}

} // namespace ddp::internal
