// ZeroRedundancyOptimizer overlapped with DistributedDataParallel's
// backward.
//
// Note [ZeRO overlap]
// DDP calls on_bucket_reduced after it has written each gradient bucket's
// reduced gradients back, in bucket order on every rank, during backward
// (Note [Bucket reduced hook] in reducer/reducer_finalize.cpp). There this
// rank steps the parameters of the bucket that it owns, with an optimizer
// of the wrapped type over exactly those (`bucket_shards`, built the first
// time a bucket is seen and again when DDP rebuilds its buckets; it holds
// their state meanwhile), and every owner's parameters of the bucket are
// broadcast, packed per owner: the collectives come at the same point of
// the DDP bucket sequence on every rank. The broadcasts run while backward
// computes the next buckets; at most kBucketsInFlight are unfinished, and
// step() finishes the rest.
//
// Note [ZeRO stage 2]
// With stage 2, overlap_with gives DDP each parameter's owner and registers
// reduce_scatter_bucket as the model's communication hook. DDP then lays
// each bucket out by owner, in rank order (Note [Released buckets] in
// src/reducer/reducer_finalize.cpp), so that each owner's gradients are one
// range of the bucket, and the hook reduce-scatters those ranges in place:
// each rank receives the sums of its own parameters' gradients only, which
// it writes, divided by the world size, into their places in the bucket.
// DDP writes back only those; a parameter another rank owns has no `.grad`
// from the moment its gradient is in the bucket, and the bucket itself is
// released once written back, so that a rank holds its own parameters'
// gradients (about 1/N) and the buckets in flight. Reduce-scatter plus the
// owners' broadcasts move the bytes of one allreduce: stage 2's step costs
// DDP's communication, where stage 1 adds the broadcasts to the allreduce.
// A bucket with a parameter the optimizer does not hold (or a sparse one)
// is all-reduced as by the default hook.
//
// Each parameter is updated by the same arithmetic as without overlap, so
// the results are the same bit for bit, from the first iteration on (PyTorch
// skips the first two while it learns the buckets). What no bucket covered
// in an iteration (no backward ran since the last step, or a parameter DDP
// does not hold) is stepped and broadcast by step() as without overlap.

#include "optim/zero_impl.h"

namespace ddp::optim {

namespace {
// `parts`, views into `buffer`, as one tensor: the range of the buffer they
// tile when they do (DDP lays a stage-2 bucket out by owner: Note [Released
// buckets] in src/reducer/reducer_finalize.cpp), else a copy.
at::Tensor contiguous_range(const at::Tensor& buffer, const std::vector<at::Tensor>& parts) {
  if (parts.empty()) {
    return at::empty({0}, buffer.options());
  }
  int64_t begin = 0;
  int64_t end = 0;
  int64_t total = 0;
  bool first = true;
  for (const auto& part : parts) {
    if (!part.is_alias_of(buffer)) {
      return at::cat(parts);
    }
    const int64_t from = part.storage_offset() - buffer.storage_offset();
    begin = first ? from : std::min(begin, from);
    end = first ? from + part.numel() : std::max(end, from + part.numel());
    total += part.numel();
    first = false;
  }
  return end - begin == total ? buffer.narrow(0, begin, total) : at::cat(parts);
}
} // namespace

void ZeroRedundancyOptimizerBase::overlap_with(DistributedDataParallel& model) {
  const auto who = impl_->who("overlap_with");
  DDP_CHECK(!impl_->overlapping, who, ": already overlapped with a model");
  DDP_CHECK(model->process_group() == impl_->group, who,
            ": the model reduces over another process group than the optimizer shards over; build "
            "both over the same group");
  std::unordered_set<const void*> ours;
  for (const auto& g : param_groups_) {
    for (const auto& p : g.params()) {
      ours.insert(p.unsafeGetTensorImpl());
    }
  }
  const auto theirs = model->parameters();
  size_t shared = 0;
  for (const auto& p : theirs) {
    shared += ours.count(p.unsafeGetTensorImpl());
  }
  DDP_CHECK(shared == theirs.size() && shared == ours.size(), who, ": the model has ", theirs.size(),
            " parameters and the optimizer ", ours.size(), ", of which ", shared,
            " are the same tensors; the optimizer must hold exactly the model's parameters");
  Impl* impl = impl_.get(); // the hook is removed by our destructor
  std::vector<OptimizerParamGroup>* groups = &param_groups_;
  std::function<int(const at::Tensor&)> gradient_owner;
  if (impl_->stage == 2) {
    // The gradients of others' parameters are never reduced here: DDP
    // leaves them undefined (Note [ZeRO stage 2]). A parameter of a group
    // added since the last step has no owner yet: every rank keeps it.
    gradient_owner = [impl](const at::Tensor& param) {
      const auto position = impl->position_of.find(param.unsafeGetTensorImpl());
      return position == impl->position_of.end()
          ? -1
          : impl->owners[position->second.first][position->second.second];
    };
  }
  model->register_bucket_reduced_hook(
      [impl, groups](size_t index, const std::vector<at::Tensor>& params) {
        impl->on_bucket_reduced(*groups, index, params);
      },
      std::move(gradient_owner));
  impl_->overlapped_model = model.ptr();
  impl_->overlapping = true;
  if (impl_->stage == 2) {
    for (const auto& item : model->module()->named_parameters()) {
      impl->model_names[item.key()] = item.value().unsafeGetTensorImpl();
    }
    const auto fallback = comm_hooks::allreduce();
    model->register_comm_hook([impl, alive = std::weak_ptr<char>(impl->alive), fallback](
                                  ProcessGroup& pg, GradBucket& bucket) {
      if (alive.expired()) {
        return fallback(pg, bucket); // the optimizer is gone: plain DDP from here
      }
      return impl->reduce_scatter_bucket(pg, bucket);
    });
  }
}

std::shared_ptr<Work> ZeroRedundancyOptimizerBase::Impl::reduce_scatter_bucket(ProcessGroup& pg,
                                                                              GradBucket& bucket) {
  const at::Tensor buffer = bucket.buffer();
  const int size = pg.size();
  if (size == 1) {
    return Work::completed({buffer.is_sparse() ? buffer.coalesce() : buffer});
  }
  const auto& names = bucket.parameter_names();
  std::vector<int> owner(names.size(), -1);
  bool known = !buffer.is_sparse();
  for (size_t k = 0; known && k < names.size(); ++k) {
    owner[k] = owner_by_name(names[k]);
    known = owner[k] >= 0;
  }
  if (!known) {
    buffer.div_(size);
    internal::CollectiveLabel label(c10::str("ZeRO stage 2, DDP gradient bucket ", bucket.index()));
    return pg.allreduce(buffer); // see Note [ZeRO stage 2]
  }
  const auto& gradients = bucket.gradients();
  std::vector<std::vector<at::Tensor>> per_owner(static_cast<size_t>(size));
  for (size_t k = 0; k < names.size(); ++k) {
    per_owner[static_cast<size_t>(owner[k])].push_back(gradients[k].reshape({-1}));
  }
  std::vector<at::Tensor> inputs;
  for (const auto& parts : per_owner) {
    inputs.push_back(contiguous_range(buffer, parts));
  }
  const int rank = pg.rank();
  auto output = at::empty_like(inputs[static_cast<size_t>(rank)]);
  std::vector<at::Tensor> mine = per_owner[static_cast<size_t>(rank)]; // views into the buffer
  internal::CollectiveLabel label(c10::str("ZeRO stage 2, DDP gradient bucket ", bucket.index(), " reduce-scatter"));
  auto work = pg.reduce_scatter(output, inputs);
  // Summed, then divided on the owner only: 1/N of the bucket, where the
  // default hook divides all of it before sending.
  return work->then([buffer, output, mine, size](const std::vector<at::Tensor>&) {
    int64_t offset = 0;
    for (const auto& view : mine) {
      at::div_out(const_cast<at::Tensor&>(view), output.narrow(0, offset, view.numel()), size);
      offset += view.numel();
    }
    return std::vector<at::Tensor>{buffer};
  });
}

std::unique_ptr<torch::optim::Optimizer> ZeroRedundancyOptimizerBase::Impl::optimizer_over(
    const std::vector<OptimizerParamGroup>& groups, const std::vector<at::Tensor>& params) {
  std::vector<std::vector<at::Tensor>> per_group(groups.size());
  for (const auto& p : params) {
    per_group[position_of.at(p.unsafeGetTensorImpl()).first].push_back(p);
  }
  std::vector<OptimizerParamGroup> shard;
  for (size_t g = 0; g < groups.size(); ++g) {
    shard.emplace_back(std::move(per_group[g]), groups[g].options().clone());
  }
  auto optimizer = factory(std::move(shard));
  auto& from = local->state();
  for (const auto& p : params) {
    auto found = from.find(detail::state_key(from, p));
    if (found != from.end()) {
      optimizer->state()[found->first] = std::move(found->second);
      from.erase(found);
    }
  }
  return optimizer;
}

void ZeroRedundancyOptimizerBase::Impl::return_states(torch::optim::Optimizer& from) {
  for (auto& [key, state] : from.state()) {
    local->state()[key] = std::move(state);
  }
  from.state().clear();
}

void ZeroRedundancyOptimizerBase::Impl::reclaim_states() {
  for (auto& shard : bucket_shards) {
    if (shard.optimizer != nullptr) {
      return_states(*shard.optimizer);
    }
  }
  bucket_shards.clear();
}

void ZeroRedundancyOptimizerBase::Impl::on_bucket_reduced(const std::vector<OptimizerParamGroup>& groups,
                                                          size_t index,
                                                          const std::vector<at::Tensor>& params) {
  const int rank = group->rank();
  const int size = group->size();
  // The owners of the bucket's parameters (those of a group added since the
  // last step, unknown yet, are left to step()).
  std::vector<int> owner_of(params.size(), -1);
  std::vector<at::Tensor> mine;
  std::vector<const void*> key;
  for (size_t k = 0; k < params.size(); ++k) {
    const void* impl = params[k].unsafeGetTensorImpl();
    const auto position = position_of.find(impl);
    if (position == position_of.end()) {
      continue;
    }
    owner_of[k] = owners[position->second.first][position->second.second];
    if (owner_of[k] == rank) {
      mine.push_back(params[k]);
      key.push_back(impl);
    }
  }
  // This rank's step of the bucket.
  if (bucket_shards.size() <= index) {
    bucket_shards.resize(index + 1);
  }
  BucketShard& shard = bucket_shards[index];
  if (shard.optimizer == nullptr || shard.params != key) {
    if (shard.optimizer != nullptr) {
      return_states(*shard.optimizer); // DDP rebuilt its buckets
    }
    shard.optimizer = optimizer_over(groups, mine);
    shard.params = key;
  }
  if (!mine.empty()) {
    auto& shard_groups = shard.optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      shard_groups[g].set_options(groups[g].options().clone());
    }
    shard.optimizer->step();
  }
  // Every owner's parameters of the bucket, from that owner.
  for (int owner = 0; owner < size; ++owner) {
    Bucket bucket;
    bucket.owner = owner;
    for (size_t k = 0; k < params.size(); ++k) {
      if (owner_of[k] == owner) {
        bucket.params.push_back(params[k]);
        bucket.numel += params[k].numel();
        stepped.insert(params[k].unsafeGetTensorImpl());
      }
    }
    if (!bucket.params.empty() && size > 1) {
      issue_broadcast(bucket);
    }
  }
}

void ZeroRedundancyOptimizerBase::Impl::finish_overlapped_step(const std::vector<OptimizerParamGroup>& groups) {
  finish_broadcasts();
  // What no bucket covered: stepped here, and broadcast by owner, as
  // without overlap. The set is the same on every rank (every rank saw the
  // same buckets).
  std::vector<at::Tensor> mine;
  std::vector<Bucket> rest(static_cast<size_t>(group->size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (stepped.count(params[i].unsafeGetTensorImpl()) != 0) {
        continue;
      }
      const int owner = owners[g][i];
      if (owner == group->rank()) {
        mine.push_back(params[i]);
      }
      auto& bucket = rest[static_cast<size_t>(owner)];
      bucket.owner = owner;
      bucket.params.push_back(params[i]);
      bucket.numel += params[i].numel();
    }
  }
  stepped.clear();
  if (!mine.empty()) {
    auto optimizer = optimizer_over(groups, mine);
    optimizer->step();
    return_states(*optimizer);
  }
  if (group->size() > 1) {
    for (const auto& bucket : rest) {
      // A packed broadcast per owner and dtype.
      std::vector<at::ScalarType> dtypes;
      for (const auto& p : bucket.params) {
        if (std::find(dtypes.begin(), dtypes.end(), p.scalar_type()) == dtypes.end()) {
          dtypes.push_back(p.scalar_type());
        }
      }
      for (const auto dtype : dtypes) {
        Bucket part;
        part.owner = bucket.owner;
        for (const auto& p : bucket.params) {
          if (p.scalar_type() == dtype) {
            part.params.push_back(p);
            part.numel += p.numel();
          }
        }
        issue_broadcast(part);
      }
    }
    finish_broadcasts();
  }
}

} // namespace ddp::optim
