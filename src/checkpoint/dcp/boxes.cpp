#include "checkpoint/dcp/boxes.h"

#include <algorithm>

namespace ddp::checkpoint::dcp {

namespace {

// Adds the boxes of elements [begin, end) of the sub-tensor at `prefix`
// (the indices of dimensions 0 .. dim-1) of a tensor of `shape`.
void split(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& prefix, int64_t begin, int64_t end,
           int64_t flat_base, std::vector<FlatBox>& out) {
  if (begin >= end) {
    return;
  }
  int64_t inner = 1; // elements of one index of dimension `dim`
  for (size_t d = dim + 1; d < shape.size(); ++d) {
    inner *= shape[d];
  }
  auto rows = [&](int64_t first, int64_t count) {
    FlatBox fb;
    fb.box.offsets = prefix;
    fb.box.offsets.push_back(first);
    fb.box.sizes.assign(prefix.size(), 1);
    fb.box.sizes.push_back(count);
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      fb.box.offsets.push_back(0);
      fb.box.sizes.push_back(shape[d]);
    }
    fb.flat_begin = flat_base + first * inner;
    out.push_back(std::move(fb));
  };
  if (begin % inner == 0 && end % inner == 0) {
    rows(begin / inner, (end - begin) / inner);
    return;
  }
  const int64_t first_row = begin / inner;
  const int64_t last_row = (end - 1) / inner;
  auto within = [&](int64_t row, int64_t from, int64_t to) {
    prefix.push_back(row);
    split(shape, dim + 1, prefix, from, to, flat_base + row * inner, out);
    prefix.pop_back();
  };
  if (first_row == last_row) {
    within(first_row, begin - first_row * inner, end - first_row * inner);
    return;
  }
  int64_t whole_from = first_row;
  if (begin % inner != 0) {
    within(first_row, begin % inner, inner);
    whole_from = first_row + 1;
  }
  const int64_t whole_to = end / inner; // exclusive
  if (whole_from < whole_to) {
    rows(whole_from, whole_to - whole_from);
  }
  if (end % inner != 0) {
    within(whole_to, 0, end % inner);
  }
}

} // namespace

std::vector<FlatBox> boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  std::vector<FlatBox> out;
  if (begin >= end) {
    return out;
  }
  if (shape.empty()) { // a 0-dimensional tensor: one element
    out.push_back({Box{}, 0});
    return out;
  }
  std::vector<int64_t> prefix;
  split(shape, 0, prefix, begin, end, 0, out);
  return out;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t from = std::max(a.offsets[d], b.offsets[d]);
    const int64_t to = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (from >= to) {
      return std::nullopt;
    }
    out.offsets.push_back(from);
    out.sizes.push_back(to - from);
  }
  return out;
}

at::Tensor narrow_to(const at::Tensor& tensor, const Box& whole, const Box& part) {
  at::Tensor out = tensor;
  for (size_t d = 0; d < part.offsets.size(); ++d) {
    out = out.narrow(static_cast<int64_t>(d), part.offsets[d] - whole.offsets[d], part.sizes[d]);
  }
  return out;
}

} // namespace ddp::checkpoint::dcp
