#pragma once

// All-to-all with split sizes (private header): the argument checks every
// backend makes alike, the element counts and offsets each rank sends and
// receives, and the check that the ranks' split sizes agree. See Note
// [Uneven all-to-all] in alltoall_splits.cpp.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include <ddp/comm/types.h>

#include "comm/collective_checks.h"

namespace ddp::internal {

// What one rank's all-to-all moves, in elements.
struct AlltoallLayout {
  bool uneven = false; // split sizes were given
  int64_t row_numel = 1; // elements per row (along the first dimension)
  std::vector<int64_t> in_rows, out_rows; // per peer
  std::vector<int64_t> send_counts, send_offsets; // per peer, elements of input
  std::vector<int64_t> recv_counts, recv_offsets; // per peer, elements of output

  // This rank's entry of the agreement table: row_numel, in_rows, out_rows.
  std::vector<int64_t> agreement_entry() const;
};

// Checks alltoall's arguments (the rules, dtypes, devices, split sizes) and
// returns what moves. Without split sizes, input and output have equal
// element counts divisible by `size`, as before; with them, both have at
// least one dimension and the same sizes past the first, and each list has
// `size` entries >= 0 summing to its tensor's first size (an empty list:
// equal chunks).
AlltoallLayout check_alltoall(const at::Tensor& output, const at::Tensor& input, int size,
                              const AlltoallOptions& options, const std::string& who,
                              const TensorRules& rules);

// Every rank's agreement_entry(), rank after rank (size * (2 size + 1)
// values): throws, the same message on every rank, unless what each rank
// sends every peer is what that peer expects from it.
void check_alltoall_agreement(const int64_t* table, int size, const std::string& who);

} // namespace ddp::internal
