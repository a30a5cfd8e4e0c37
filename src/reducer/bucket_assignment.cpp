#include "reducer/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "internal/check.h"

namespace ddp::internal {

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<GradientSpec>& gradients,
    const std::vector<size_t>& size_limits_bytes,
    const std::vector<size_t>& fill_order) {
  DDP_CHECK(!size_limits_bytes.empty(), "bucket assignment: no size limits given");
  std::vector<size_t> order = fill_order;
  if (order.empty()) {
    for (size_t i = gradients.size(); i > 0; --i) {
      order.push_back(i - 1);
    }
  }
  DDP_CHECK(order.size() == gradients.size(), "bucket assignment: fill order has ", order.size(),
            " entries for ", gradients.size(), " gradients");
  std::vector<bool> seen(gradients.size(), false);
  for (size_t index : order) {
    DDP_CHECK(index < gradients.size() && !seen[index],
              "bucket assignment: fill order is not a permutation (index ", index, ")");
    seen[index] = true;
  }

  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t limit_index = 0;
  };
  using Key = std::tuple<int, int, int>; // dtype, device type, device index
  std::map<Key, Open> open;
  // (position in fill order of the first gradient, bucket)
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;
  std::vector<size_t> position(gradients.size());
  for (size_t p = 0; p < order.size(); ++p) {
    position[order[p]] = p;
  }

  for (size_t index : order) {
    const auto& spec = gradients[index];
    if (spec.sparse) {
      closed.emplace_back(position[index], std::vector<size_t>{index});
      continue;
    }
    const Key key{static_cast<int>(spec.dtype), static_cast<int>(spec.device.type()),
                  static_cast<int>(spec.device.index())};
    Open& bucket = open[key];
    bucket.indices.push_back(index);
    bucket.bytes += spec.bytes;
    const size_t limit =
        size_limits_bytes[std::min(bucket.limit_index, size_limits_bytes.size() - 1)];
    if (bucket.bytes >= limit) {
      closed.emplace_back(position[bucket.indices.front()], std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      ++bucket.limit_index;
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.indices.empty()) {
      closed.emplace_back(position[bucket.indices.front()], std::move(bucket.indices));
    }
  }
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<size_t>> result;
  result.reserve(closed.size());
  for (auto& entry : closed) {
    result.push_back(std::move(entry.second));
  }
  return result;
}

} // namespace ddp::internal
