#include "comm/alltoall_splits.h"

#include <c10/util/StringUtil.h>

#include <numeric>

#include "internal/check.h"

namespace ddp::internal {

// Note [Uneven all-to-all]
// PyTorch's all_to_all_single with split sizes: rank s sends rows
// [sum(in_s[0..r)), +in_s[r]) of its input to rank r, which writes them at
// rows [sum(out_r[0..s)), +out_r[s]) of its output. Nothing is checked
// across ranks in PyTorch: a rank that expects fewer rows than its peer
// sends gets a failure of the transport, or a hang. Here each backend
// first all-gathers every rank's (row size, input splits, output splits)
// in the same task as the exchange (2 size + 1 integers per rank, one
// small collective), and every rank checks the whole table the same way,
// so that all of them fail with the same message naming the first pair
// that disagrees, before any data moves. The collective's fingerprint
// carries kUneven instead of an element count, which differs by rank.

std::vector<int64_t> AlltoallLayout::agreement_entry() const {
  std::vector<int64_t> entry{row_numel};
  entry.insert(entry.end(), in_rows.begin(), in_rows.end());
  entry.insert(entry.end(), out_rows.begin(), out_rows.end());
  return entry;
}

namespace {

// Rows per peer from `splits` (or equal chunks of `rows`), checked.
std::vector<int64_t> rows_per_peer(const std::vector<int64_t>& splits, int64_t rows, int size,
                                   const std::string& who, const char* name, const char* tensor) {
  if (splits.empty()) {
    DDP_CHECK(rows % size == 0, who, ": ", tensor, " has ", rows, " rows, which do not split into ",
              size, " equal chunks; pass ", name, " for uneven chunks");
    return std::vector<int64_t>(static_cast<size_t>(size), rows / size);
  }
  DDP_CHECK(splits.size() == static_cast<size_t>(size), who, ": ", name, " has ", splits.size(),
            " entries, expected ", size, " (one per rank)");
  int64_t total = 0;
  for (size_t r = 0; r < splits.size(); ++r) {
    DDP_CHECK(splits[r] >= 0, who, ": ", name, "[", r, "] is ", splits[r], ", expected a row count >= 0");
    total += splits[r];
  }
  DDP_CHECK(total == rows, who, ": ", name, " sums to ", total, " rows, but ", tensor, " has ", rows,
            " (its first size); expected them equal");
  return splits;
}

void fill_counts(const std::vector<int64_t>& rows, int64_t row_numel, std::vector<int64_t>& counts,
                 std::vector<int64_t>& offsets) {
  int64_t at = 0;
  for (const int64_t r : rows) {
    counts.push_back(r * row_numel);
    offsets.push_back(at);
    at += r * row_numel;
  }
}

} // namespace

AlltoallLayout check_alltoall(const at::Tensor& output, const at::Tensor& input, int size,
                              const AlltoallOptions& options, const std::string& who,
                              const TensorRules& rules) {
  AlltoallLayout layout;
  layout.uneven = !options.input_split_sizes.empty() || !options.output_split_sizes.empty();
  if (!layout.uneven) {
    rules.check(input, who, "input");
    check_matches(output, input, who, "output", "input", rules);
    DDP_CHECK(input.numel() % size == 0, who, ": input has ", input.numel(),
              " elements, which does not split into ", size, " equal chunks");
    const int64_t chunk = input.numel() / size;
    layout.in_rows = layout.out_rows = std::vector<int64_t>(static_cast<size_t>(size), chunk);
  } else {
    rules.check(input, who, "input");
    rules.check(output, who, "output");
    DDP_CHECK(output.scalar_type() == input.scalar_type(), who, ": output has dtype ", output.scalar_type(),
              ", expected ", input.scalar_type(), " like input");
    if (rules.one_device_reason != nullptr) {
      DDP_CHECK(output.device() == input.device(), who, ": output is on ", output.device(), ", expected ",
                input.device(), " like input (", rules.one_device_reason, ")");
    }
    DDP_CHECK(input.dim() >= 1 && output.dim() >= 1, who, ": split sizes split the first dimension, but ",
              input.dim() < 1 ? "input" : "output", " has none (a 0-dimensional tensor)");
    DDP_CHECK(input.sizes().slice(1) == output.sizes().slice(1), who, ": input (sizes ", input.sizes(),
              ") and output (sizes ", output.sizes(), ") differ past the first dimension; their rows must have ",
              "one shape");
    layout.row_numel = std::accumulate(input.sizes().begin() + 1, input.sizes().end(), int64_t{1},
                                       std::multiplies<int64_t>());
    layout.in_rows = rows_per_peer(options.input_split_sizes, input.size(0), size, who, "input_split_sizes",
                                   "input");
    layout.out_rows = rows_per_peer(options.output_split_sizes, output.size(0), size, who,
                                    "output_split_sizes", "output");
  }
  const int64_t row = layout.uneven ? layout.row_numel : 1;
  fill_counts(layout.in_rows, row, layout.send_counts, layout.send_offsets);
  fill_counts(layout.out_rows, row, layout.recv_counts, layout.recv_offsets);
  return layout;
}

void check_alltoall_agreement(const int64_t* table, int size, const std::string& who) {
  const size_t stride = 2 * static_cast<size_t>(size) + 1;
  const auto entry = [&](int rank) { return table + static_cast<size_t>(rank) * stride; };
  for (int r = 1; r < size; ++r) {
    DDP_CHECK(entry(r)[0] == entry(0)[0], who, ": the ranks' rows differ: rank 0's rows have ", entry(0)[0],
              " elements, rank ", r, "'s ", entry(r)[0], "; every rank's input and output must have the same ",
              "sizes past the first dimension");
  }
  for (int sender = 0; sender < size; ++sender) {
    for (int receiver = 0; receiver < size; ++receiver) {
      const int64_t sent = entry(sender)[1 + receiver];
      const int64_t expected = entry(receiver)[1 + size + sender];
      DDP_CHECK(sent == expected, who, ": the split sizes do not agree: rank ", sender, " sends ", sent,
                " rows to rank ", receiver, " (its input_split_sizes[", receiver, "]), but rank ", receiver,
                " expects ", expected, " from rank ", sender, " (its output_split_sizes[", sender,
                "]); each rank's output_split_sizes[s] must equal rank s's input_split_sizes[that rank]");
    }
  }
}

} // namespace ddp::internal
