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

#include "optim/zero_impl.h"

#include <cstring>

#include <ddp/comm/error.h>
#include <ddp/timeline.h>

#include "internal/logging.h"

namespace ddp::optim {

ZeroRedundancyOptimizerBase::ZeroRedundancyOptimizerBase(
    std::vector<OptimizerParamGroup> param_groups, std::unique_ptr<torch::optim::OptimizerOptions> defaults,
    Factory factory, const ZeroRedundancyOptimizerOptions& options)
    : Optimizer(std::move(param_groups), std::move(defaults)), impl_(std::make_unique<Impl>()) {
  impl_->group = options.process_group() != nullptr ? options.process_group() : default_process_group();
  impl_->factory = std::move(factory);
  impl_->bucket_view = options.parameters_as_bucket_view();
  DDP_CHECK(options.stage() == 1 || options.stage() == 2, impl_->who(""), ": stage must be 1 or 2 (got ",
            options.stage(), ")");
  impl_->stage = options.stage();
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

ZeroRedundancyOptimizerBase::~ZeroRedundancyOptimizerBase() {
  if (auto model = impl_->overlapped_model.lock()) {
    try {
      model->register_bucket_reduced_hook(nullptr);
    } catch (const std::exception& e) {
      // Destroyed during a backward: the hook would outlive us.
      internal::log_warning(c10::str(impl_->who(""), ": destroyed while its model's backward was "
                                     "running; the model must not run backward again: ", error_message(e)));
    }
  }
}

torch::Tensor ZeroRedundancyOptimizerBase::step(LossClosure closure) {
  TimelineScope traced("ZeroRedundancyOptimizer.step", "optimizer"); // Note [Timeline]
  if (impl_->owners.size() != param_groups_.size()) {
    // Groups added through torch::optim::Optimizer::add_param_group, which
    // is not virtual: shard them now (every rank steps, so every rank does).
    const size_t first = impl_->owners.size();
    impl_->check_parameters(param_groups_, first);
    impl_->check_same_on_every_rank(param_groups_);
    impl_->reclaim_states();
    impl_->partition(param_groups_, first);
  }
  impl_->consolidated.reset();
  DDP_CHECK(impl_->stage == 1 || impl_->overlapping, impl_->who("step"),
            ": stage 2 reduce-scatters the model's gradients: call overlap_with(model) on every rank "
            "before the first backward");
  if (impl_->overlapping) {
    // The buckets stepped during backward; the closure runs that backward.
    at::Tensor loss;
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    impl_->finish_overlapped_step(param_groups_);
    return loss;
  }
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
  impl_->reclaim_states();
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
  impl_->reclaim_states();
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
  internal::CollectiveLabel label("ZeRO consolidate_state_dict");
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

const torch::optim::Optimizer& ZeroRedundancyOptimizerBase::consolidated() const {
  DDP_CHECK(impl_->consolidated != nullptr, impl_->who("save"),
            ": this rank holds no consolidated state. Call consolidate_state_dict(to) on every rank "
            "after the last step, then save on rank `to` (ddp::save_checkpoint does both)");
  return *impl_->consolidated;
}

void ZeroRedundancyOptimizerBase::save(torch::serialize::OutputArchive& archive) const {
  consolidated().save(archive);
}

void ZeroRedundancyOptimizerBase::load(torch::serialize::InputArchive& archive) {
  // See Note [ZeRO checkpoints] (the narrative at the top).
  auto full = impl_->factory(Impl::clone_groups(param_groups_));
  full->load(archive);
  impl_->reclaim_states();
  auto& local_state = impl_->local->state();
  local_state.clear();
  for (const auto& g : impl_->local->param_groups()) {
    for (const auto& p : g.params()) {
      auto found = full->state().find(detail::state_key(full->state(), p));
      if (found != full->state().end()) {
        local_state[found->first] = std::move(found->second);
      }
    }
  }
  impl_->consolidated.reset();
}

torch::optim::Optimizer& ZeroRedundancyOptimizerBase::local_optimizer() {
  // With overlap, the states of the buckets' parameters live in the
  // buckets' optimizers between steps: bring them home (the next backward
  // moves them out again).
  impl_->reclaim_states();
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
