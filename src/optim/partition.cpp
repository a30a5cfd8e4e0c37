// Which rank owns each parameter of a ZeroRedundancyOptimizer: PyTorch's
// greedy rule (ZeroRedundancyOptimizer._partition_parameters), kept a pure
// function so that it is tested without a process group.
//
// Worked example, 2 ranks, one group of counts [4, 10, 6, 10]: largest
// first gives 10 (index 1), 10 (index 3), 6, 4. Index 1 goes to rank 0
// (totals 0, 0: the lowest rank), index 3 to rank 1 (10, 0), index 2 to
// rank 0 (10, 10), index 0 to rank 1 (16, 10): owners [1, 0, 0, 1], totals
// 16 and 14. A second group starts from those totals.

#include <algorithm>
#include <numeric>

#include <ddp/optim/zero_redundancy_optimizer.h>

#include "internal/check.h"

namespace ddp::optim {

std::vector<std::vector<int>> partition_parameters(const std::vector<std::vector<int64_t>>& numels,
                                                   int world_size) {
  DDP_CHECK(world_size >= 1, "partition_parameters: world_size must be at least 1 (got ", world_size,
            ")");
  std::vector<int64_t> totals(static_cast<size_t>(world_size), 0);
  std::vector<std::vector<int>> owners;
  owners.reserve(numels.size());
  for (size_t g = 0; g < numels.size(); ++g) {
    const auto& counts = numels[g];
    std::vector<size_t> order(counts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    // Largest first; a stable sort keeps equal counts in their order, as
    // Python's sorted(..., reverse=True) does.
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return counts[a] > counts[b]; });
    std::vector<int> group_owners(counts.size(), 0);
    for (const size_t i : order) {
      DDP_CHECK(counts[i] >= 0, "partition_parameters: parameter ", i, " of group ", g,
                " has a negative element count (", counts[i], ")");
      // The first smallest total: the lowest rank on a tie.
      const auto smallest = std::min_element(totals.begin(), totals.end());
      group_owners[i] = static_cast<int>(smallest - totals.begin());
      *smallest += counts[i];
    }
    owners.push_back(std::move(group_owners));
  }
  return owners;
}

} // namespace ddp::optim
