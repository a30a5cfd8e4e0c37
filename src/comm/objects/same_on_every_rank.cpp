// One check that every rank built the same thing (same_on_every_rank.h).

#include "comm/objects/same_on_every_rank.h"

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstring>

#include "internal/check.h"
#include "internal/hash.h"

namespace ddp::internal {

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) {
    text += line;
    text += '\n';
  }
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    start = end == std::string::npos ? text.size() : end + 1;
  }
  return lines;
}

std::string counted(size_t n, const std::string& item) {
  return c10::str(n, " ", item, n == 1 ? "" : "s");
}

} // namespace

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
                                      : std::string(static_cast<const char*>(all[r].data_ptr()), length_r));
  }
  return result;
}

std::string difference_message(const std::vector<std::vector<std::string>>& ranks, const SameOnEveryRank& words) {
  std::vector<int> differ;
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r] != ranks[0]) {
      differ.push_back(static_cast<int>(r));
    }
  }
  if (differ.empty()) {
    return "";
  }
  const int r = differ.front();
  const auto& reference = ranks[0];
  const auto& theirs = ranks[static_cast<size_t>(r)];
  size_t k = 0;
  while (k < theirs.size() && k < reference.size() && theirs[k] == reference[k]) {
    ++k;
  }
  std::string first;
  if (k < theirs.size() && k < reference.size()) {
    first = c10::str(words.item, " ", k, " is ", theirs[k], " on rank ", r, " but ", reference[k], " on rank 0");
  } else {
    const bool rank0_longer = k < reference.size();
    first = c10::str("rank ", r, " has ", counted(theirs.size(), words.item), " and rank 0 has ",
                     counted(reference.size(), words.item), " (", words.item, " ", k, " is ",
                     rank0_longer ? reference[k] : theirs[k], " on rank ", rank0_longer ? 0 : r, " only)");
  }
  return c10::str(words.who, ": ", words.differ, ": rank(s) ", c10::ArrayRef<int>(differ),
                  " differ from rank 0; first, ", first, ". ", words.advice);
}

void check_same_on_every_rank(ProcessGroup& group, const std::vector<std::string>& lines, c10::Device device,
                              const SameOnEveryRank& words) {
  if (group.size() == 1) {
    return;
  }
  const std::string mine = joined(lines);
  const auto options = at::TensorOptions(at::kLong).device(device);
  auto hash = at::full({1}, static_cast<int64_t>(fnv1a(mine) >> 1), options);
  std::vector<at::Tensor> hashes;
  for (int r = 0; r < group.size(); ++r) {
    hashes.push_back(at::empty({1}, options));
  }
  group.allgather(hashes, hash)->wait();
  const auto all_hashes = at::cat(hashes).cpu();
  if (all_hashes.eq(all_hashes[0]).all().item<bool>()) {
    return;
  }
  // Every rank learns that they differ, and learns every rank's lines, so
  // that every rank throws the same message.
  std::vector<std::vector<std::string>> ranks;
  for (const auto& text : allgather_strings(group, mine, device)) {
    ranks.push_back(split(text));
  }
  const std::string message = difference_message(ranks, words);
  // Equal lines under different hashes cannot happen with one build on
  // every rank; fail all the same.
  throw_check_error(__func__, __FILE__, __LINE__,
                    message.empty() ? c10::str(words.who, ": ", words.differ, " (their descriptions' hashes differ). ",
                                               words.advice)
                                    : message);
}

} // namespace ddp::internal
