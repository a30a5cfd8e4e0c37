// FullyShardedDataParallel's checks across ranks at construction
// (construction_checks.h).

#include "fsdp/construction_checks.h"

#include <torch/torch.h>

#include <cstring>
#include <sstream>
#include <vector>

#include "checkpoint/names.h"
#include "internal/check.h"
#include "internal/hash.h"

namespace ddp::fsdp {

namespace {

// Broadcasts rank 0's `text` over `group` (its size, then its bytes).
std::string broadcast_text(ProcessGroup& group, const std::string& text, const c10::Device& device) {
  auto size = torch::tensor({static_cast<int64_t>(text.size())}, torch::kLong).to(device);
  group.broadcast(size, BroadcastOptions{0})->wait();
  const int64_t n = size.cpu().item<int64_t>();
  auto bytes = torch::zeros({n}, torch::kUInt8);
  if (group.rank() == 0) {
    std::memcpy(bytes.data_ptr(), text.data(), text.size());
  }
  bytes = bytes.to(device);
  group.broadcast(bytes, BroadcastOptions{0})->wait();
  bytes = bytes.cpu();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
}

// The first line where `a` and `b` differ, for an error message.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(sa, la));
    const bool more_b = static_cast<bool>(std::getline(sb, lb));
    if (!more_a && !more_b) {
      return "(no line differs)";
    }
    if (!more_a || !more_b || la != lb) {
      return c10::str("rank 0: '", more_a ? la : std::string("(nothing)"), "', this rank: '",
                      more_b ? lb : std::string("(nothing)"), "'");
    }
  }
}


} // namespace

void check_same_units(ProcessGroup& group, const std::string& mine, const c10::Device& device,
                      const std::string& who) {
  auto hash = torch::tensor({static_cast<int64_t>(internal::fnv1a(mine) >> 1)}, torch::kLong).to(device);
  std::vector<at::Tensor> hashes;
  for (int r = 0; r < group.size(); ++r) {
    hashes.push_back(torch::empty_like(hash));
  }
  group.allgather(hashes, hash)->wait();
  std::vector<int> differ;
  for (int r = 1; r < group.size(); ++r) {
    if (!hashes[r].cpu().equal(hashes[0].cpu())) {
      differ.push_back(r);
    }
  }
  if (!differ.empty()) {
    const std::string theirs = broadcast_text(group, mine, device);
    std::string ranks;
    for (const int r : differ) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    DDP_CHECK(false, who, ": ranks wrap different units: rank(s) ", ranks,
              " differ from rank 0 (every rank must wrap the same model); first difference: ",
              first_difference(theirs, mine));
  }
}

void check_same_values(const torch::nn::Module& module, ProcessGroup& group, const c10::Device& device,
                       const std::string& who) {
  std::vector<std::string> names;
  std::vector<int64_t> sums;
  auto add = [&](const std::string& name, const at::Tensor& tensor) {
    const auto bytes = tensor.detach().to(at::kCPU).contiguous();
    names.push_back(name);
    sums.push_back(static_cast<int64_t>(
        internal::fnv1a(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes())) >> 1));
  };
  for (const auto& item : checkpoint::named_state(module)) {
    add(item.name, item.tensor);
  }
  if (sums.empty()) {
    return;
  }
  auto mine = torch::tensor(sums, torch::kLong).to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < group.size(); ++r) {
    all.push_back(torch::empty_like(mine));
  }
  group.allgather(all, mine)->wait();
  const auto first = all[0].cpu();
  for (int r = 1; r < group.size(); ++r) {
    const auto theirs = all[r].cpu();
    for (size_t i = 0; i < names.size(); ++i) {
      DDP_CHECK(theirs[static_cast<int64_t>(i)].item<int64_t>() == first[static_cast<int64_t>(i)].item<int64_t>(),
                who, ": the ranks' initial values differ, first at '", names[i], "' (rank ", r,
                " against rank 0): FSDP shards what each rank holds and broadcasts nothing, so the model would "
                "train a mix of them. Build the model from the same seed on every rank, or pass "
                "FullyShardedDataParallelOptions().sync_module_states(true) to take rank 0's values (PyTorch's "
                "sync_module_states)");
    }
  }
}


} // namespace ddp::fsdp
