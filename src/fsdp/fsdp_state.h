#pragma once

// FullyShardedDataParallelImpl's state, shared by
// fully_sharded_data_parallel.cpp (construction, forward, backward) and
// state_dict.cpp (full states, gradient clipping). Private.
//
// An iteration, for units u_0 .. u_n-1 in the order their forward ran:
//   forward   pre-forward(u_i): gather u_i (or wait for its prefetch), hook
//             its gradients; with forward_prefetch start u_i+1's gather.
//             post-forward(u_i): hook u_i's outputs (pre-backward); under
//             kFullShard free u_i-1 (the last unit stays gathered for
//             its backward, which comes first).
//   backward  pre-backward(u_i), the first of u_i's output hooks: gather
//             u_i again; with backward_prefetch start u_i-1's gather.
//             u_i ready (every parameter has its gradient): reductions
//             start in reverse forward order, so that every rank issues
//             them in the same order whatever the order they became ready
//             in (a unit waits for the later ones); then u_i is freed.
//             Beyond kReductionsInFlight, the oldest reduction is finished
//             (waited for, added to its shard's gradient) before the next.
//   end       the final callback: units that never became ready (unused
//             parameters) are reduced with zeros for the missing
//             gradients, every reduction is waited for and added to the
//             shards' gradients, whatever is still gathered is freed.

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ddp/nn/fully_sharded_data_parallel.h>

#include "fsdp/flat_unit.h"

namespace ddp {

namespace detail {
// What an FsdpUnit holds of the FullyShardedDataParallel that wraps it.
class FsdpUnitState {
 public:
  FsdpUnitState(std::weak_ptr<FullyShardedDataParallelImpl::State> root, size_t unit)
      : root(std::move(root)), unit(unit) {}
  std::weak_ptr<FullyShardedDataParallelImpl::State> root;
  size_t unit;
};
} // namespace detail

// Where a unit is in the iteration (FSDP2's TrainingState). A checkpointed
// module inside a unit (ddp::Checkpointed) runs its forward again while its
// unit is in kPreBackward: gathered, its gradients not yet all arrived.
enum class TrainingState {
  kIdle,        // between its forwards, or before the first
  kForward,     // its forward runs
  kPreBackward, // its backward started (gathered again), gradients arriving
  kPostBackward // every gradient arrived: reduced (or reducing) and freed
};

const char* to_string(TrainingState state);

// Reductions started and not yet finished, at most: each holds its unit's
// full gradient (in the reduce dtype) until it is finished.
constexpr size_t kReductionsInFlight = 2;

struct FullyShardedDataParallelImpl::State : std::enable_shared_from_this<State> {
  FullyShardedDataParallelOptions options;
  std::shared_ptr<ProcessGroup> group;
  fsdp::UnitConfig config;
  std::vector<std::unique_ptr<fsdp::FlatUnit>> units;
  // Sequential: the unit of each child (-1: a child without parameters).
  std::vector<int> unit_of_child;
  // The unit of the parameters outside every other unit, or -1.
  int root_unit = -1;
  // Every parameter name of the wrapped module: (unit, entry) it lives at.
  std::unordered_map<std::string, std::pair<size_t, size_t>> where;
  // The FsdpUnits of a custom module, to detach them when this goes away.
  std::vector<std::shared_ptr<FsdpUnitImpl>> unit_modules;

  // ---- The iteration ----
  bool in_forward = false;
  std::vector<size_t> forward_order;      // units whose forward ran with grad
  std::vector<size_t> last_forward_order; // the previous iteration's (prefetch)
  std::vector<TrainingState> training;   // per unit
  size_t next_reduce = 0;                 // into forward_order, from the back
  // When this forward with gradients began, for the timeline (0: none).
  int64_t timeline_forward_start_us = 0;
  std::deque<size_t> reducing;            // started, not finished, in order
  bool callback_queued = false;
  int pending_free = -1; // kFullShard: the unit freed when the next one's forward ends
  std::shared_ptr<bool> no_sync = std::make_shared<bool>(false);

  bool frees_after_forward() const {
    const auto s = options.sharding_strategy();
    return s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard;
  }
  bool frees_after_backward() const { return options.sharding_strategy() != ShardingStrategy::kNoShard; }

  void unit_pre_forward(size_t unit, int next_unit);
  void unit_post_forward(size_t unit, std::vector<at::Tensor>& outputs);
  void pre_backward(size_t unit);
  void unit_ready(size_t unit);
  bool in_forward_order(size_t unit) const;
  void flush_reductions();
  void finish_backward();
  // The unit after `unit` in the last iteration's forward order, or -1.
  int next_in_last_order(size_t unit) const;
};

namespace detail {
// One parameter of the unwrapped model as an optimizer over the shards sees
// it (optim_state.cpp).
struct ParamSlot {
  size_t unit;
  size_t entry;
  std::string name; // PyTorch's (module_state_dict's)
  size_t order;     // position in the module's parameter order
};

// The optimizer's groups as lists of the unwrapped model's parameters, each
// group in module order. Throws c10::Error starting with `who` when a shard
// is in no group or in two, or the optimizer holds another tensor.
std::vector<std::vector<ParamSlot>> optimizer_param_slots(FullyShardedDataParallelImpl& model,
                                                          const torch::optim::Optimizer& optimizer,
                                                          const std::string& who);

// What the code around FullyShardedDataParallelImpl (sharded checkpoints)
// reads of it.
struct FsdpAccess {
  static FullyShardedDataParallelImpl::State& state(FullyShardedDataParallelImpl& model) { return *model.state_; }
  static torch::nn::Module& module(FullyShardedDataParallelImpl& model) { return *model.module_; }
};
} // namespace detail

} // namespace ddp
