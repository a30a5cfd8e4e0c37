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

#include <cstring>
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

std::vector<std::string> allgather_strings(ProcessGroup& group, const std::string& mine,
                                           c10::Device device) {
  const int size = group.size();
  if (size == 1) {
    return {mine};
  }
  const auto long_options = at::TensorOptions(at::kLong).device(device);
  auto length = at::full({1}, static_cast<int64_t>(mine.size()), long_options);
  std::vector<at::Tensor> lengths;
  for (int r = 0; r < size; ++r) {
    lengths.push_back(at::empty({1}, long_options));
  }
  group.allgather(lengths, length)->wait();
  for (auto& l : lengths) {
    l = l.cpu();
  }
  int64_t longest = 0;
  for (const auto& l : lengths) {
    longest = std::max(longest, l.item<int64_t>());
  }
  auto bytes = at::zeros({longest}, at::kByte);
  if (!mine.empty()) {
    std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  }
  bytes = bytes.to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < size; ++r) {
    all.push_back(at::empty({longest}, at::TensorOptions(at::kByte).device(device)));
  }
  group.allgather(all, bytes)->wait();
  for (auto& a : all) {
    a = a.cpu();
  }
  std::vector<std::string> result;
  for (int r = 0; r < size; ++r) {
    const auto length_r = static_cast<size_t>(lengths[r].item<int64_t>());
    result.emplace_back(length_r == 0 ? std::string()
                                      : std::string(static_cast<const char*>(all[r].data_ptr()),
                                                    length_r));
  }
  return result;
}

} // namespace ddp::internal
