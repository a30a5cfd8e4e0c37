#pragma once

// ZeroRedundancyOptimizerBase's implementation, shared by
// zero_redundancy_optimizer.cpp (sharding, steps, checkpoints) and
// zero_overlap.cpp (the steps run during DDP's backward). Private.

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ddp/init.h>
#include <ddp/nn/distributed_data_parallel.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include "comm/collective_label.h"
#include "internal/check.h"
#include "internal/torch_compat.h"

namespace ddp::optim {

using torch::optim::OptimizerParamGroup;

namespace detail {

// Buckets of the broadcast after a step. Bounded so that the packed copies
// cost at most two buckets of memory at a time (kBucketsInFlight).
constexpr int64_t kBucketCapBytes = 25 * 1024 * 1024;
constexpr size_t kBucketsInFlight = 2;

using torch::optim::OptimizerParamGroup;

// One broadcast after each step: `params`, owned by `owner`, of one dtype.
struct Bucket {
  int owner = 0;
  std::vector<at::Tensor> params;
  int64_t numel = 0;
  // Set when the bucket is broadcast in place: the single parameter itself
  // (too large to pack), or the flat buffer the parameters are views of.
  at::Tensor in_place;
};

// The key of `param` in an optimizer's state map (torch_compat.h).
using internal::state_key;

} // namespace detail

struct ZeroRedundancyOptimizerBase::Impl {
  using Bucket = detail::Bucket;

  std::shared_ptr<ProcessGroup> group;
  Factory factory;
  bool bucket_view = false;
  c10::Device device = c10::kCPU;
  // owners[g][i]: the rank owning parameter i of group g.
  std::vector<std::vector<int>> owners;
  std::unique_ptr<torch::optim::Optimizer> local;
  // Every rank's state, on the rank of the last consolidate_state_dict only.
  std::unique_ptr<torch::optim::Optimizer> consolidated;
  std::vector<Bucket> buckets;
  // Broadcasts started and not yet finished, oldest first.
  struct InFlight {
    Bucket bucket;
    at::Tensor packed; // undefined when broadcast in place
    std::shared_ptr<Work> work;
  };
  std::deque<InFlight> in_flight;

  // ---- Overlap with DDP's backward (zero_overlap.cpp) ----
  // Per DDP bucket index: an optimizer of the wrapped type over the
  // parameters of that bucket this rank owns, holding their state while it
  // exists (the others' state stays in `local`); see Note [ZeRO overlap].
  struct BucketShard {
    std::vector<const void*> params; // TensorImpls, in the bucket's order
    std::unique_ptr<torch::optim::Optimizer> optimizer;
  };
  std::vector<BucketShard> bucket_shards;
  bool overlapping = false;
  int stage = 1;
  // The model's implementation, to remove the hook when this goes away.
  std::weak_ptr<DistributedDataParallelImpl> overlapped_model;
  // Parameters stepped by a bucket this iteration.
  std::unordered_set<const void*> stepped;
  // (group, index in the group) of each parameter, by TensorImpl; filled
  // by partition().
  std::unordered_map<const void*, std::pair<size_t, size_t>> position_of;
  // Runs after DDP wrote bucket `index`'s reduced gradients.
  void on_bucket_reduced(const std::vector<OptimizerParamGroup>& groups, size_t index,
                         const std::vector<at::Tensor>& params);
  // step() with overlap: finishes the broadcasts, steps and broadcasts
  // what no bucket covered.
  void finish_overlapped_step(const std::vector<OptimizerParamGroup>& groups);
  // Expires with this Impl: stage 2's communication hook, which the model
  // keeps for good (a hook cannot be replaced after the first backward),
  // checks it and falls back to the default allreduce once we are gone.
  std::shared_ptr<char> alive = std::make_shared<char>(0);
  // Stage 2: the owner of the parameter named `name` in the model, or -1.
  std::unordered_map<std::string, const void*> model_names;
  int owner_by_name(const std::string& name) const;
  // Stage 2's communication hook: see Note [ZeRO stage 2] in zero_overlap.cpp.
  std::shared_ptr<Work> reduce_scatter_bucket(ProcessGroup& pg, GradBucket& bucket);
  // Moves every bucket optimizer's state back into `local`.
  void reclaim_states();
  // An optimizer of the wrapped type over `params` (split by group, with
  // the groups' current options), holding their states taken from `local`.
  std::unique_ptr<torch::optim::Optimizer> optimizer_over(const std::vector<OptimizerParamGroup>& groups,
                                                          const std::vector<at::Tensor>& params);
  // Moves the states of `from` back into `local`.
  void return_states(torch::optim::Optimizer& from);

  std::string who(const char* op) const;

  // Copies of `groups` (our param_groups), each keeping only the
  // parameters that `rank` owns, in the order the partition gave them to it.
  std::vector<OptimizerParamGroup> shard_groups(const std::vector<OptimizerParamGroup>& groups,
                                                int rank) const;

  // Indices of `group`'s parameters, largest first (the partition's order).
  static std::vector<size_t> assignment_order(const OptimizerParamGroup& group);

  static std::vector<OptimizerParamGroup> clone_groups(const std::vector<OptimizerParamGroup>& groups);

  // Checks the parameters of `groups` from group `first` on: dense, on one
  // device, each in one group only.
  void check_parameters(const std::vector<OptimizerParamGroup>& groups, size_t first);

  // A collective: every rank must describe the same groups (counts, shapes,
  // dtypes, order), else all of them throw, naming the ranks that differ.
  void check_same_on_every_rank(const std::vector<OptimizerParamGroup>& groups);

  void build_buckets(const std::vector<OptimizerParamGroup>& groups);

  void add_view_bucket(int owner, at::ScalarType dtype, const std::vector<at::Tensor>& params);

  void add_packed_buckets(int owner, at::ScalarType dtype, const std::vector<at::Tensor>& params);

  // Every rank's parameters from their owners; see the narrative at the top.
  void broadcast_parameters();

  // Starts broadcasting `bucket` from its owner, after finishing the oldest
  // broadcast when kBucketsInFlight are in flight already.
  void issue_broadcast(const Bucket& bucket);

  void finish_oldest_broadcast();

  void finish_broadcasts();

  // (Re)computes the owners of every group, builds `local` when it does not
  // exist yet, or adds to it the shards of groups from `first` on.
  void partition(const std::vector<OptimizerParamGroup>& groups, size_t first);
};


} // namespace ddp::optim
