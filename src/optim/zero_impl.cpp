// ZeroRedundancyOptimizerBase::Impl's sharding, its checks across ranks and
// the broadcasts after a step (zero_impl.h); the steps during DDP's
// backward are in zero_overlap.cpp.

#include "optim/zero_impl.h"

#include "comm/objects/same_on_every_rank.h"

namespace ddp::optim {

int ZeroRedundancyOptimizerBase::Impl::owner_by_name(const std::string& name) const {
  const auto impl = model_names.find(name);
  if (impl == model_names.end()) {
    return -1;
  }
  const auto position = position_of.find(impl->second);
  return position == position_of.end() ? -1 : owners[position->second.first][position->second.second];
}

std::string ZeroRedundancyOptimizerBase::Impl::who(const char* op) const {
  return c10::str("[rank ", group->rank(), "/", group->size(), "] ZeroRedundancyOptimizer",
                  op[0] == '\0' ? "" : "::", op);
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizerBase::Impl::shard_groups(
    const std::vector<OptimizerParamGroup>& groups, int rank) const {
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

std::vector<size_t> ZeroRedundancyOptimizerBase::Impl::assignment_order(const OptimizerParamGroup& group) {
  const auto& params = group.params();
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  return order;
}

std::vector<OptimizerParamGroup> ZeroRedundancyOptimizerBase::Impl::clone_groups(
    const std::vector<OptimizerParamGroup>& groups) {
  std::vector<OptimizerParamGroup> copy;
  for (const auto& g : groups) {
    copy.emplace_back(g.params(), g.options().clone());
  }
  return copy;
}

void ZeroRedundancyOptimizerBase::Impl::check_parameters(const std::vector<OptimizerParamGroup>& groups, size_t first) {
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

void ZeroRedundancyOptimizerBase::Impl::check_same_on_every_rank(const std::vector<OptimizerParamGroup>& groups) {
  // One line per parameter (and per empty group, which shifts the owners
  // of the groups after it just the same).
  std::vector<std::string> lines;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].params().empty()) {
      lines.push_back(c10::str("(group ", g, ", empty)"));
    }
    for (const auto& p : groups[g].params()) {
      lines.push_back(c10::str(p.scalar_type(), " ", p.sizes(), " in group ", g));
    }
  }
  internal::check_same_on_every_rank(*group, lines, device,
                                     {who(""), "the parameters differ across ranks", "parameter",
                                      "Construct it over the same parameters, in the same groups and order, "
                                      "on every rank."});
}

void ZeroRedundancyOptimizerBase::Impl::build_buckets(const std::vector<OptimizerParamGroup>& groups) {
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

void ZeroRedundancyOptimizerBase::Impl::add_view_bucket(int owner, at::ScalarType dtype,
                                                        const std::vector<at::Tensor>& params) {
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

void ZeroRedundancyOptimizerBase::Impl::add_packed_buckets(int owner, at::ScalarType dtype,
                                                           const std::vector<at::Tensor>& params) {
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

void ZeroRedundancyOptimizerBase::Impl::broadcast_parameters() {
  if (group->size() == 1) {
    return;
  }
  for (const auto& bucket : buckets) {
    issue_broadcast(bucket);
  }
  finish_broadcasts();
}

void ZeroRedundancyOptimizerBase::Impl::issue_broadcast(const Bucket& bucket) {
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

void ZeroRedundancyOptimizerBase::Impl::finish_oldest_broadcast() {
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

void ZeroRedundancyOptimizerBase::Impl::finish_broadcasts() {
  while (!in_flight.empty()) {
    finish_oldest_broadcast();
  }
}

void ZeroRedundancyOptimizerBase::Impl::partition(const std::vector<OptimizerParamGroup>& groups, size_t first) {
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
} // namespace ddp::optim
