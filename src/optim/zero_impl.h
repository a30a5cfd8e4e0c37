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
#include "internal/hash.h"
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

using internal::fnv1a; // the description of the parameters that ranks compare

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
  int owner_by_name(const std::string& name) const {
    const auto impl = model_names.find(name);
    if (impl == model_names.end()) {
      return -1;
    }
    const auto position = position_of.find(impl->second);
    return position == position_of.end() ? -1 : owners[position->second.first][position->second.second];
  }
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

  std::string who(const char* op) const {
    return c10::str("[rank ", group->rank(), "/", group->size(), "] ZeroRedundancyOptimizer",
                    op[0] == '\0' ? "" : "::", op);
  }

  // Copies of `groups` (our param_groups), each keeping only the
  // parameters that `rank` owns, in the order the partition gave them to it.
  std::vector<OptimizerParamGroup> shard_groups(const std::vector<OptimizerParamGroup>& groups,
                                                int rank) const {
    std::vector<OptimizerParamGroup> shard;
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<at::Tensor> mine;
      for (const auto i : assignment_order(groups[g])) {
        if (owners[g][i] == rank) {
          mine.push_back(groups[g].params()[i]);
        }
      }
      shard.emplace_back(std::move(mine), groups[g].options().clone());
    }
    return shard;
  }

  // Indices of `group`'s parameters, largest first (the partition's order).
  static std::vector<size_t> assignment_order(const OptimizerParamGroup& group) {
    const auto& params = group.params();
    std::vector<size_t> order(params.size());
    for (size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
    return order;
  }

  static std::vector<OptimizerParamGroup> clone_groups(const std::vector<OptimizerParamGroup>& groups) {
    std::vector<OptimizerParamGroup> copy;
    for (const auto& g : groups) {
      copy.emplace_back(g.params(), g.options().clone());
    }
    return copy;
  }

  // Checks the parameters of `groups` from group `first` on: dense, on one
  // device, each in one group only.
  void check_parameters(const std::vector<OptimizerParamGroup>& groups, size_t first) {
    std::unordered_map<const void*, size_t> seen;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const auto& p : groups[g].params()) {
        const auto [it, inserted] = seen.emplace(p.unsafeGetTensorImpl(), g);
        DDP_CHECK(inserted, who(""), ": a parameter of shape ", p.sizes(), " is in parameter group ",
                  it->second, it->second == g ? " twice" : c10::str(" and in group ", g),
                  "; each parameter may appear once");
        if (g < first) {
          continue;
        }
        DDP_CHECK(!p.is_sparse(), who(""), ": parameter of shape ", p.sizes(), " in group ", g,
                  " is sparse; sharded optimizer state needs dense parameters");
        DDP_CHECK(p.device() == device, who(""), ": parameter of shape ", p.sizes(), " in group ", g,
                  " is on ", p.device(), ", the first parameter on ", device,
                  "; every parameter must be on one device");
      }
    }
  }

  // A collective: every rank must describe the same groups (counts, shapes,
  // dtypes, order), else all of them throw, naming the ranks that differ.
  void check_same_on_every_rank(const std::vector<OptimizerParamGroup>& groups) {
    std::string text;
    int64_t params = 0;
    int64_t elements = 0;
    for (const auto& g : groups) {
      text += c10::str("group ", g.params().size(), ";");
      for (const auto& p : g.params()) {
        text += c10::str(p.scalar_type(), p.sizes(), ";");
        ++params;
        elements += p.numel();
      }
    }
    const int size = group->size();
    const auto options = at::TensorOptions(at::kLong).device(device);
    auto mine = at::tensor({static_cast<int64_t>(detail::fnv1a(text)), static_cast<int64_t>(groups.size()),
                            params, elements},
                           at::kLong)
                    .to(device);
    std::vector<at::Tensor> all;
    for (int r = 0; r < size; ++r) {
      all.push_back(at::empty({4}, options));
    }
    group->allgather(all, mine)->wait();
    const auto own = mine.cpu();
    std::string differing;
    for (int r = 0; r < size; ++r) {
      const auto theirs = all[static_cast<size_t>(r)].cpu();
      if (!at::equal(theirs, own)) {
        const auto* v = theirs.data_ptr<int64_t>();
        differing += c10::str("; rank ", r, " has ", v[1], " group(s), ", v[2], " parameters, ", v[3],
                              " elements");
      }
    }
    DDP_CHECK(differing.empty(), who(""), ": the parameters differ across ranks: this rank has ",
              groups.size(), " group(s), ", params, " parameters, ", elements, " elements", differing,
              " (equal counts mean different shapes, dtypes or order). Construct it over the same "
              "parameters, in the same groups and order, on every rank");
  }

  void build_buckets(const std::vector<OptimizerParamGroup>& groups) {
    buckets.clear();
    const int size = group->size();
    for (int owner = 0; owner < size; ++owner) {
      // This owner's parameters by dtype, dtypes in order of first appearance.
      std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> by_dtype;
      for (const auto& g : shard_groups(groups, owner)) {
        for (const auto& p : g.params()) {
          auto it = std::find_if(by_dtype.begin(), by_dtype.end(),
                                 [&](const auto& entry) { return entry.first == p.scalar_type(); });
          if (it == by_dtype.end()) {
            by_dtype.push_back({p.scalar_type(), {}});
            it = by_dtype.end() - 1;
          }
          it->second.push_back(p);
        }
      }
      for (auto& [dtype, params] : by_dtype) {
        if (bucket_view) {
          add_view_bucket(owner, dtype, params);
        } else {
          add_packed_buckets(owner, dtype, params);
        }
      }
    }
  }

  void add_view_bucket(int owner, at::ScalarType dtype, const std::vector<at::Tensor>& params) {
    Bucket bucket;
    bucket.owner = owner;
    bucket.params = params;
    for (const auto& p : params) {
      bucket.numel += p.numel();
    }
    at::NoGradGuard no_grad;
    bucket.in_place = at::empty({bucket.numel}, at::TensorOptions(dtype).device(device));
    int64_t offset = 0;
    for (const auto& p : params) {
      auto view = bucket.in_place.narrow(0, offset, p.numel()).view(p.sizes());
      view.copy_(p.detach());
      // The parameter keeps its identity (and its gradient); its values
      // now live in the bucket. See Note [Parameters as bucket views].
      at::Tensor(p).set_data(view);
      offset += p.numel();
    }
    buckets.push_back(std::move(bucket));
  }

  void add_packed_buckets(int owner, at::ScalarType dtype, const std::vector<at::Tensor>& params) {
    const int64_t cap = std::max<int64_t>(1, detail::kBucketCapBytes / static_cast<int64_t>(c10::elementSize(dtype)));
    Bucket open;
    open.owner = owner;
    for (const auto& p : params) {
      if (p.numel() >= cap) {
        Bucket alone;
        alone.owner = owner;
        alone.params = {p};
        alone.numel = p.numel();
        alone.in_place = p.detach();
        buckets.push_back(std::move(alone));
        continue;
      }
      if (open.numel + p.numel() > cap) {
        buckets.push_back(std::move(open));
        open = Bucket();
        open.owner = owner;
      }
      open.params.push_back(p);
      open.numel += p.numel();
    }
    if (!open.params.empty()) {
      buckets.push_back(std::move(open));
    }
  }

  // Every rank's parameters from their owners; see the narrative at the top.
  void broadcast_parameters() {
    if (group->size() == 1) {
      return;
    }
    for (const auto& bucket : buckets) {
      issue_broadcast(bucket);
    }
    finish_broadcasts();
  }

  // Starts broadcasting `bucket` from its owner, after finishing the oldest
  // broadcast when kBucketsInFlight are in flight already.
  void issue_broadcast(const Bucket& bucket) {
    internal::CollectiveLabel label(c10::str("ZeRO step: rank ", bucket.owner, "'s updated parameters"));
    at::NoGradGuard no_grad;
    if (in_flight.size() == detail::kBucketsInFlight) {
      finish_oldest_broadcast();
    }
    InFlight f{bucket, at::Tensor(), nullptr};
    at::Tensor target = bucket.in_place;
    if (!target.defined()) {
      if (bucket.owner == group->rank()) {
        std::vector<at::Tensor> flat;
        for (const auto& p : bucket.params) {
          flat.push_back(p.detach().reshape({-1}));
        }
        f.packed = at::cat(flat);
      } else {
        f.packed = at::empty({bucket.numel}, bucket.params.front().options());
      }
      target = f.packed;
    }
    f.work = group->broadcast(target, {bucket.owner});
    in_flight.push_back(std::move(f));
  }

  void finish_oldest_broadcast() {
    at::NoGradGuard no_grad;
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    f.work->wait();
    if (f.packed.defined() && f.bucket.owner != group->rank()) {
      int64_t offset = 0;
      for (const auto& p : f.bucket.params) {
        p.detach().copy_(f.packed.narrow(0, offset, p.numel()).view(p.sizes()));
        offset += p.numel();
      }
    }
  }

  void finish_broadcasts() {
    while (!in_flight.empty()) {
      finish_oldest_broadcast();
    }
  }

  // (Re)computes the owners of every group, builds `local` when it does not
  // exist yet, or adds to it the shards of groups from `first` on.
  void partition(const std::vector<OptimizerParamGroup>& groups, size_t first) {
    std::vector<std::vector<int64_t>> numels;
    for (const auto& g : groups) {
      std::vector<int64_t> counts;
      for (const auto& p : g.params()) {
        counts.push_back(p.numel());
      }
      numels.push_back(std::move(counts));
    }
    owners = partition_parameters(numels, group->size());
    position_of.clear();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        position_of[params[i].unsafeGetTensorImpl()] = {g, i};
      }
    }
    auto shard = shard_groups(groups, group->rank());
    if (local == nullptr) {
      local = factory(std::move(shard));
      DDP_INTERNAL_ASSERT(local != nullptr && local->param_groups().size() == groups.size());
    } else {
      for (size_t g = first; g < shard.size(); ++g) {
        local->add_param_group(shard[g]);
      }
    }
    build_buckets(groups);
  }
};


} // namespace ddp::optim
