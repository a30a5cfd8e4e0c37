// FullyShardedDataParallel's check of initial values across ranks at
// construction (construction_checks.h).

#include "fsdp/construction_checks.h"

#include <torch/torch.h>

#include <vector>

#include "checkpoint/names.h"
#include "internal/check.h"
#include "internal/hash.h"

namespace ddp::fsdp {

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
