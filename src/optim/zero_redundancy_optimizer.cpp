// ZeroRedundancyOptimizer (ZeRO stage 1): how it works.
//
// The object is a torch::optim::Optimizer whose own param_groups hold every
// parameter (so zero_grad, parameters() and learning-rate schedulers see
// what they would see on a plain optimizer) and whose own state stays empty.
// The state lives in `local`, an optimizer of the wrapped type built by the
// factory over this rank's shard: one group per group of ours, holding the
// parameters this rank owns (partition_parameters, PyTorch's rule), in the
// order the rule assigned them.
//
// step(): the groups' options (a scheduler may have changed the learning
// rate) are copied into `local`'s groups, `local` steps, and every rank's
// parameters are broadcast from their owner. The broadcast plan (`buckets`)
// is the same on every rank: owners in rank order, per owner its parameters
// by dtype, packed into buckets of at most kBucketCapBytes (a larger
// parameter is broadcast in place, alone), or, with
// parameters_as_bucket_view, one flat buffer per owner and dtype that the
// parameters are views of, broadcast in place.
//
// Checkpoints (Note [ZeRO checkpoints]): a plain optimizer's saved state is
// keyed by its parameters' positions in its groups. consolidate_state_dict
// gathers each rank's `local->save()` bytes on one rank, loads each into a
// scratch optimizer over that rank's shard (same groups, same order, so the
// positions match) and moves the per-parameter states into `consolidated`,
// a scratch optimizer over all the parameters in our groups' order; save()
// writes that one, byte for byte the format of a plain optimizer. load()
// does the reverse on every rank: a scratch optimizer over all parameters
// reads the file, and this rank keeps the states of the parameters it owns.

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>

#include <ddp/init.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include "internal/check.h"

namespace ddp::optim {

namespace {

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

// The key of `param` in an optimizer's state map: LibTorch 1.13 keys it by
// the TensorImpl's address printed as a string, 2.x by the address itself.
template <typename Map>
typename Map::key_type state_key(const Map& /*map*/, const at::Tensor& param) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream text;
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

// FNV-1a, for the description of the parameters that ranks compare.
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (const unsigned char c : text) {
    hash = (hash ^ c) * 1099511628211ULL;
  }
  return hash;
}

} // namespace

struct ZeroRedundancyOptimizerBase::Impl {
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
    auto mine = at::tensor({static_cast<int64_t>(fnv1a(text)), static_cast<int64_t>(groups.size()),
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
    const int64_t cap = std::max<int64_t>(1, kBucketCapBytes / static_cast<int64_t>(c10::elementSize(dtype)));
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
    at::NoGradGuard no_grad;
    const int rank = group->rank();
    struct InFlight {
      const Bucket* bucket;
      at::Tensor packed; // undefined when broadcast in place
      std::shared_ptr<Work> work;
    };
    std::vector<InFlight> in_flight;
    const auto finish = [&](InFlight& f) {
      f.work->wait();
      if (f.packed.defined() && f.bucket->owner != rank) {
        int64_t offset = 0;
        for (const auto& p : f.bucket->params) {
          p.detach().copy_(f.packed.narrow(0, offset, p.numel()).view(p.sizes()));
          offset += p.numel();
        }
      }
    };
    for (const auto& bucket : buckets) {
      if (in_flight.size() == kBucketsInFlight) {
        finish(in_flight.front());
        in_flight.erase(in_flight.begin());
      }
      InFlight f{&bucket, at::Tensor(), nullptr};
      at::Tensor target = bucket.in_place;
      if (!target.defined()) {
        if (bucket.owner == rank) {
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
    for (auto& f : in_flight) {
      finish(f);
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

ZeroRedundancyOptimizerBase::ZeroRedundancyOptimizerBase(
    std::vector<OptimizerParamGroup> param_groups, std::unique_ptr<torch::optim::OptimizerOptions> defaults,
    Factory factory, const ZeroRedundancyOptimizerOptions& options)
    : Optimizer(std::move(param_groups), std::move(defaults)), impl_(std::make_unique<Impl>()) {
  impl_->group = options.process_group() != nullptr ? options.process_group() : default_process_group();
  impl_->factory = std::move(factory);
  impl_->bucket_view = options.parameters_as_bucket_view();
  for (const auto& g : param_groups_) {
    if (!g.params().empty()) {
      impl_->device = g.params().front().device();
      break;
    }
  }
  impl_->check_parameters(param_groups_, 0);
  impl_->check_same_on_every_rank(param_groups_);
  impl_->partition(param_groups_, 0);
}

ZeroRedundancyOptimizerBase::~ZeroRedundancyOptimizerBase() = default;

torch::Tensor ZeroRedundancyOptimizerBase::step(LossClosure closure) {
  if (impl_->owners.size() != param_groups_.size()) {
    // Groups added through torch::optim::Optimizer::add_param_group, which
    // is not virtual: shard them now (every rank steps, so every rank does).
    const size_t first = impl_->owners.size();
    impl_->check_parameters(param_groups_, first);
    impl_->check_same_on_every_rank(param_groups_);
    impl_->partition(param_groups_, first);
  }
  impl_->consolidated.reset();
  auto& local_groups = impl_->local->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    local_groups[g].set_options(param_groups_[g].options().clone());
  }
  auto loss = impl_->local->step(std::move(closure));
  impl_->broadcast_parameters();
  return loss;
}

void ZeroRedundancyOptimizerBase::add_param_group(const OptimizerParamGroup& param_group) {
  const size_t first = param_groups_.size();
  {
    // Refused before it is added: a parameter already in a group.
    std::vector<OptimizerParamGroup> all = Impl::clone_groups(param_groups_);
    all.emplace_back(param_group.params(), defaults().clone());
    impl_->check_parameters(all, first);
  }
  Optimizer::add_param_group(param_group);
  impl_->check_same_on_every_rank(param_groups_);
  impl_->consolidated.reset();
  impl_->partition(param_groups_, first);
}

void ZeroRedundancyOptimizerBase::consolidate_state_dict(int to) {
  auto& group = *impl_->group;
  DDP_CHECK(to >= 0 && to < group.size(), impl_->who("consolidate_state_dict"), ": rank ", to,
            " is not in the group of ", group.size(), " ranks");
  impl_->consolidated.reset();
  std::ostringstream bytes;
  {
    torch::serialize::OutputArchive archive;
    impl_->local->save(archive);
    archive.save_to(bytes);
  }
  const std::string blob = bytes.str();
  const auto device = impl_->device;
  const auto long_options = at::TensorOptions(at::kLong).device(device);
  std::vector<at::Tensor> sizes;
  for (int r = 0; r < group.size(); ++r) {
    sizes.push_back(at::empty({1}, long_options));
  }
  group.allgather(sizes, at::full({1}, static_cast<int64_t>(blob.size()), long_options))->wait();
  int64_t longest = 0;
  std::vector<int64_t> lengths;
  for (const auto& s : sizes) {
    lengths.push_back(s.cpu().item<int64_t>());
    longest = std::max(longest, lengths.back());
  }
  auto mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr<uint8_t>(), blob.data(), blob.size());
  mine = mine.to(device);
  std::vector<at::Tensor> gathered;
  if (group.rank() == to) {
    for (int r = 0; r < group.size(); ++r) {
      gathered.push_back(at::empty({longest}, at::TensorOptions(at::kByte).device(device)));
    }
  }
  group.gather(gathered, mine, {to})->wait();
  if (group.rank() != to) {
    return;
  }
  auto full = impl_->factory(Impl::clone_groups(param_groups_));
  for (int r = 0; r < group.size(); ++r) {
    auto shard = impl_->factory(impl_->shard_groups(param_groups_, r));
    const auto data = gathered[static_cast<size_t>(r)].cpu();
    torch::serialize::InputArchive archive;
    archive.load_from(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()),
                      static_cast<size_t>(lengths[static_cast<size_t>(r)]), device);
    shard->load(archive);
    for (auto& [key, state] : shard->state()) {
      full->state()[key] = std::move(state);
    }
  }
  impl_->consolidated = std::move(full);
}

void ZeroRedundancyOptimizerBase::save(torch::serialize::OutputArchive& archive) const {
  DDP_CHECK(impl_->consolidated != nullptr, impl_->who("save"),
            ": this rank holds no consolidated state. Call consolidate_state_dict(to) on every rank "
            "after the last step, then save on rank `to` (ddp::save_checkpoint does both)");
  impl_->consolidated->save(archive);
}

void ZeroRedundancyOptimizerBase::load(torch::serialize::InputArchive& archive) {
  // See Note [ZeRO checkpoints] (the narrative at the top).
  auto full = impl_->factory(Impl::clone_groups(param_groups_));
  full->load(archive);
  auto& local_state = impl_->local->state();
  local_state.clear();
  for (const auto& g : impl_->local->param_groups()) {
    for (const auto& p : g.params()) {
      auto found = full->state().find(state_key(full->state(), p));
      if (found != full->state().end()) {
        local_state[found->first] = std::move(found->second);
      }
    }
  }
  impl_->consolidated.reset();
}

torch::optim::Optimizer& ZeroRedundancyOptimizerBase::local_optimizer() {
  return *impl_->local;
}

int ZeroRedundancyOptimizerBase::owner_of(const at::Tensor& parameter) const {
  for (size_t g = 0; g < param_groups_.size() && g < impl_->owners.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) {
        return impl_->owners[g][i];
      }
    }
  }
  DDP_CHECK(false, impl_->who("owner_of"), ": the tensor of shape ", parameter.sizes(),
            " is not one of the optimizer's parameters");
  return -1;
}

std::vector<at::Tensor> ZeroRedundancyOptimizerBase::parameters_of_rank(int rank) const {
  DDP_CHECK(rank >= 0 && rank < impl_->group->size(), impl_->who("parameters_of_rank"), ": rank ", rank,
            " is not in the group of ", impl_->group->size(), " ranks");
  std::vector<at::Tensor> params;
  for (const auto& g : impl_->shard_groups(param_groups_, rank)) {
    params.insert(params.end(), g.params().begin(), g.params().end());
  }
  return params;
}

const std::shared_ptr<ProcessGroup>& ZeroRedundancyOptimizerBase::process_group() const {
  return impl_->group;
}

} // namespace ddp::optim
