// One unit's flat parameter: sharding, gathering, freeing and the gradient
// reduction. See the narrative in flat_unit.h.

#include "fsdp/flat_unit.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <utility>

#include "comm/collective_label.h"
#include "internal/check.h"

namespace ddp::fsdp {

// Note [Refilled storage]: autograd keeps, from a unit's forward to its
// backward, tensors that view the gathered parameters (a Linear's
// `weight.t()`); they hold `full`'s StorageImpl, not the parameter. Freeing
// `full` by dropping the tensor would leave that memory alive in the graph
// (no saving at all); instead the StorageImpl stays and only its memory
// goes (data pointer null, 0 bytes), and the gather before backward
// allocates new memory into the same StorageImpl and fills it with the
// same values. Writes into `full` bump `full`'s version counter only; the
// parameters and the views autograd saved have their own.

// Note [Shards in mapped memory]
// On Gloo or MPI with the ranks on one host (config.shared_reduce set), each
// unit's shard, and under mixed precision the buffer its low-precision copy
// is cast into, is allocated with allocate_collective_buffer: memory that
// every rank maps, at the same place of the same allocation on every rank
// (the units are made in the same order everywhere). The gather's
// all-gather then reads each peer's shard straight from its memory (one
// copy, no messages; Note [Shared buffers]) and ends with a barrier, so
// that no rank changes its shard (an optimizer step) while a peer reads it.
// The optimizer updates the shard in place, and every load copies into it,
// so it stays where it was allocated. Where the memory cannot be mapped the
// buffer is private and the all-gather sends messages as before.

// Note [Gathered in common memory]
// On one host (Gloo or MPI, config.shared_reduce set), each unit's gathered
// parameters `full` are one buffer that every rank maps
// (ProcessGroup::allocate_common_buffer), and rank r's shard is its part
// r of it (in the compute dtype; under mixed precision the shard stays
// apart and is cast into that part by a gather of new values, the first of
// each forward, not by the gather again for backward). The all-gather is
// then a barrier: once every rank has passed it, every part holds its
// rank's current shard, and nothing is copied. Freeing
// points the parameters at empty tensors as elsewhere, but the memory
// stays: it holds the shards. The host holds each parameter once, where
// every rank's gathered copies would otherwise be.
// Why no rank changes its part while a peer computes with it: a shard
// changes in an optimizer step (or a load) only, and a rank steps after
// its reductions have completed, that is after every rank has produced
// every unit's gradients, the last use of the parameters in that
// iteration (a node that uses a parameter is an edge into its gradient's
// accumulation); the next use on any rank follows the next gather's
// barrier, which every rank reaches only after its own step. Writes into
// the gathered parameters (under no_grad) change the shards, where
// private copies would lose them at the next free. DDP_FSDP_COMMON_GATHER=0
// gathers into private memory as before.

at::Tensor take_shard(std::vector<FlatEntry>& entries, int world, int rank) {
  torch::NoGradGuard no_grad;
  int64_t total = 0;
  for (auto& entry : entries) {
    entry.shape = entry.param.sizes().vec();
    entry.numel = entry.param.numel();
    entry.offset = total;
    total += entry.numel;
  }
  const int64_t shard_numel = (total + world - 1) / world;
  const int64_t begin = rank * shard_numel, end = begin + shard_numel;
  auto shard = torch::zeros({shard_numel}, entries.front().param.options().requires_grad(false));
  for (auto& entry : entries) {
    const int64_t from = std::max(begin, entry.offset), to = std::min(end, entry.offset + entry.numel);
    if (from < to) {
      shard.narrow(0, from - begin, to - from)
          .copy_(entry.param.detach().reshape({-1}).narrow(0, from - entry.offset, to - from));
    }
    entry.param.set_data(torch::empty({0}, entry.param.options()));
    entry.laid_out = true;
  }
  return shard;
}

FlatUnit::FlatUnit(std::string label, std::vector<FlatEntry> entries, const UnitConfig& config, at::Tensor shard)
    : label_(std::move(label)), entries_(std::move(entries)), config_(config) {
  DDP_INTERNAL_ASSERT(!entries_.empty(), "a unit without parameters");
  if (config_.shard_group) {
    shard_world_ = config_.shard_group->size();
    shard_rank_ = config_.shard_group->rank();
  }
  const at::Tensor& first = entries_.front().param;
  for (auto& entry : entries_) {
    DDP_CHECK(entry.param.scalar_type() == first.scalar_type() && entry.param.device() == first.device(),
              config_.who, ": unit ", label_, " holds parameters of different dtypes or devices (",
              entries_.front().name, ": ", first.scalar_type(), " on ", first.device(), "; ", entry.name, ": ",
              entry.param.scalar_type(), " on ", entry.param.device(),
              "); make them one, or put them in different units");
    DDP_CHECK(entry.param.requires_grad() == first.requires_grad(), config_.who, ": unit ", label_,
              " mixes frozen and trainable parameters (", entries_.front().name, " requires_grad=",
              first.requires_grad(), ", ", entry.name, " requires_grad=", entry.param.requires_grad(),
              "); put the frozen ones in a unit of their own");
    DDP_INTERNAL_ASSERT(entry.laid_out == shard.defined(), "a unit laid out in part");
    if (!entry.laid_out) {
      entry.shape = entry.param.sizes().vec();
      entry.numel = entry.param.numel();
    }
    entry.offset = total_numel_;
    total_numel_ += entry.numel;
  }
  shard_numel_ = (total_numel_ + shard_world_ - 1) / shard_world_;
  compute_dtype_ = config_.param_dtype.value_or(first.scalar_type());
  reduce_dtype_ = config_.reduce_dtype.value_or(compute_dtype_);

  torch::NoGradGuard no_grad;
  at::Tensor own = shard;
  if (!own.defined()) {
    auto flat = torch::zeros({padded_numel()}, first.options().requires_grad(false));
    for (const auto& entry : entries_) {
      flat.narrow(0, entry.offset, entry.numel).copy_(entry.param.detach().reshape({-1}));
    }
    own = flat.narrow(0, shard_rank_ * shard_numel_, shard_numel_);
  }
  DDP_INTERNAL_ASSERT(own.numel() == shard_numel_, "a shard of the wrong size");
  if (config_.shared_reduce && config_.shared_reduce->common_gather && shard_world_ > 1) {
    // Note [Gathered in common memory]
    full_ = config_.shard_group->allocate_common_buffer(padded_numel(), own.options().dtype(compute_dtype_));
    common_ = full_.defined();
  }
  if (common_ && compute_dtype_ == own.scalar_type()) {
    // The shard is this rank's part of the common buffer: a tensor of its
    // own over those bytes (not a view of `full_`), keeping it alive. (Under
    // mixed precision it stays private, below, and is cast into its part.)
    at::Tensor keep = full_;
    shard_ = at::from_blob(full_.narrow(0, shard_rank_ * shard_numel_, shard_numel_).data_ptr(),
                           {shard_numel_}, [keep](void*) {}, own.options());
    shard_.copy_(own);
  } else if (!common_ && config_.shared_reduce && shard_world_ > 1) {
    // Note [Shards in mapped memory]
    shard_ = config_.shard_group->allocate_collective_buffer(shard_numel_, own.options());
    shard_.copy_(own);
    if (compute_dtype_ != shard_.scalar_type()) {
      gather_source_ = config_.shard_group->allocate_collective_buffer(
          shard_numel_, own.options().dtype(compute_dtype_));
    }
  } else if (config_.offload_params && !first.device().is_cpu()) {
    // Host memory, pinned so that the copies to the GPU run asynchronously.
    offloaded_ = true;
    shard_ = torch::empty({shard_numel_}, own.options().device(at::kCPU).pinned_memory(true));
    shard_.copy_(own);
  } else {
    // A shard taken at construction (take_shard) is this unit's alone;
    // a slice of `flat` is copied out of it.
    shard_ = shard.defined() ? own : own.clone();
  }
  shard_.set_requires_grad(first.requires_grad());
  if (!common_) {
    full_ = torch::empty({padded_numel()}, first.options().dtype(compute_dtype_).requires_grad(false));
  }
  empty_ = torch::empty({0}, full_.options());
  free_full();
}

FlatUnit::~FlatUnit() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (accumulators_[i]) {
      accumulators_[i]->del_post_hook(hook_keys_[i]);
    }
  }
}

void FlatUnit::allocate_full() {
  if (common_) {
    return; // always there
  }
  auto* storage = full_.storage().unsafeGetStorageImpl();
  if (storage->data() == nullptr) {
    config_.pool->fill(*storage, static_cast<size_t>(padded_numel()) * full_.element_size());
  }
}

void FlatUnit::release_full() {
  if (common_) {
    return; // the shards live there
  }
  config_.pool->drain(*full_.storage().unsafeGetStorageImpl());
}

void FlatUnit::point_params_at_full() {
  torch::NoGradGuard no_grad;
  for (auto& entry : entries_) {
    entry.param.set_data(full_.narrow(0, entry.offset, entry.numel).view(entry.shape));
  }
}

void FlatUnit::start_gather() {
  if (state_ == State::kGathering) {
    if (!stale_) {
      return;
    }
    // A gather of older values (a prefetch the last iteration did not use,
    // kept under kNoShard): finish it, then gather again.
    wait_gather();
  }
  torch::NoGradGuard no_grad;
  if (common_) {
    gather_in_common();
    return;
  }
  allocate_full();
  gather_input_ = shard_.detach();
  if (offloaded_) {
    // From pinned memory: queued on the GPU's stream, the CPU goes on.
    gather_input_ = gather_input_.to(full_.device(), compute_dtype_, /*non_blocking=*/true);
  }
  if (gather_source_.defined()) {
    gather_input_ = gather_source_.copy_(gather_input_);
  } else if (gather_input_.scalar_type() != compute_dtype_) {
    gather_input_ = gather_input_.to(compute_dtype_);
  }
  if (shard_world_ == 1) {
    full_.copy_(gather_input_);
    gather_work_.reset();
  } else {
    internal::CollectiveLabel label(c10::str("FSDP unit ", label_, " all-gather"));
    gather_work_ = config_.shard_group->allgather_into_tensor(full_, gather_input_);
  }
  state_ = State::kGathering;
  stale_ = false;
}

void FlatUnit::gather_in_common() {
  // Note [Gathered in common memory]
  if (shard_.scalar_type() != compute_dtype_ && stale_) {
    full_.narrow(0, shard_rank_ * shard_numel_, shard_numel_).copy_(shard_.detach());
  }
  internal::CollectiveLabel label(c10::str("FSDP unit ", label_, " all-gather (a barrier: common memory)"));
  gather_work_ = config_.shard_group->barrier();
  state_ = State::kGathering;
  stale_ = false;
}

void FlatUnit::wait_gather() {
  if (state_ != State::kGathering) {
    return;
  }
  if (gather_work_) {
    auto work = std::move(gather_work_);
    work->wait();
  }
  gather_input_ = at::Tensor();
  point_params_at_full();
  state_ = State::kGathered;
}

void FlatUnit::ensure_gathered() {
  if (state_ == State::kSharded || stale_) {
    start_gather();
  }
  wait_gather();
}

void FlatUnit::free_full() {
  wait_gather();
  for (auto& entry : entries_) {
    entry.param.set_data(empty_);
  }
  release_full();
  state_ = State::kSharded;
}

void FlatUnit::hook_gradients(std::function<void()> on_ready) {
  on_ready_ = std::move(on_ready);
  accumulators_.resize(entries_.size());
  hook_keys_.resize(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    const at::Tensor& param = entries_[i].param;
    if (!param.requires_grad()) {
      continue;
    }
    // Created here, with the gathered shape and dtype, if the parameter has
    // none; kept alive by accumulators_ from then on, so autograd reuses it.
    auto accumulator = torch::autograd::impl::grad_accumulator(param);
    if (accumulator == accumulators_[i]) {
      continue;
    }
    if (accumulators_[i]) {
      accumulators_[i]->del_post_hook(hook_keys_[i]);
    }
    // Runs on the autograd engine's thread; `this` outlives the hook, which
    // the destructor removes.
    hook_keys_[i] = accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          if (++grads_seen_ == entries_.size() && on_ready_) {
            on_ready_();
          }
          return outputs;
        }));
    accumulators_[i] = std::move(accumulator);
  }
}

void FlatUnit::start_reduce() {
  DDP_INTERNAL_ASSERT(!reduce_out_.defined(), "unit ", label_, " reduced twice in one backward");
  torch::NoGradGuard no_grad;
  auto* shared = config_.shared_reduce.get();
  reduce_in_shared_ = shared != nullptr && shard_world_ > 1 && shared->dtype == reduce_dtype_ &&
                      padded_numel() <= shared->numel;
  if (reduce_in_shared_ && shared->slots.empty()) {
    for (size_t k = 0; k < kSharedReduceSlots; ++k) {
      shared->slots.push_back(config_.shard_group->allocate_collective_buffer(
          shared->numel, full_.options().dtype(reduce_dtype_)));
    }
    // The same answer on every rank: an allocation is shared on all or none.
    shared->usable = config_.shard_group->is_shared_buffer(shared->slots.back());
  }
  reduce_in_shared_ = reduce_in_shared_ && shared->usable;
  if (reduce_in_shared_) {
    reduce_in_ = shared->slots[shared->next++ % shared->slots.size()].narrow(0, 0, padded_numel());
  } else {
    reduce_in_ = config_.pool->take(padded_numel(), full_.options().dtype(reduce_dtype_));
  }
  // The predivision is done as each gradient is copied in, one pass over
  // memory instead of two: x / predivide, rounded once to the reduction's
  // dtype, as the copy then the division gave (a gradient of another dtype,
  // under mixed precision, is converted first, as before).
  const bool predivide = config_.predivide != 1;
  for (auto& entry : entries_) {
    at::Tensor& grad = entry.param.mutable_grad();
    auto slice = reduce_in_.narrow(0, entry.offset, entry.numel);
    if (!grad.defined()) {
      slice.zero_(); // a parameter unused in this backward
      continue;
    }
    if (predivide && grad.scalar_type() == reduce_dtype_) {
      at::div_out(slice, grad.reshape({-1}), config_.predivide);
    } else {
      slice.copy_(grad.reshape({-1}));
      if (predivide) {
        slice.div_(config_.predivide);
      }
    }
    grad = at::Tensor();
  }
  reduce_in_.narrow(0, total_numel_, padded_numel() - total_numel_).zero_();
  if (shard_world_ == 1) {
    reduce_out_ = reduce_in_;
    reduce_work_.reset();
  } else if (reduce_in_shared_) {
    // Note [Shards in mapped memory]: each rank reads its shard of every
    // rank's slot where it lies and sums it into its own, in place.
    internal::CollectiveLabel label(c10::str("FSDP unit ", label_, " reduce-scatter"));
    reduce_out_ = reduce_in_.narrow(0, shard_rank_ * shard_numel_, shard_numel_);
    reduce_work_ =
        config_.shard_group->reduce_scatter(reduce_out_, reduce_in_.split(shard_numel_), ReduceScatterOptions{});
  } else {
    reduce_out_ = config_.pool->take(shard_numel_, reduce_in_.options());
    internal::CollectiveLabel label(c10::str("FSDP unit ", label_, " reduce-scatter"));
    reduce_work_ =
        config_.shard_group->reduce_scatter(reduce_out_, reduce_in_.split(shard_numel_), ReduceScatterOptions{});
  }
}

void FlatUnit::finish_reduce() {
  if (!reduce_out_.defined()) {
    return;
  }
  torch::NoGradGuard no_grad;
  if (reduce_work_) {
    auto work = std::move(reduce_work_);
    work->wait();
  }
  at::Tensor reduced = std::move(reduce_out_);
  reduce_out_ = at::Tensor();
  if (reduce_in_shared_) {
    reduce_in_ = at::Tensor(); // the slot stays the ring's
  } else {
    config_.pool->recycle(reduce_in_); // (kept when it is `reduced`: one rank)
  }
  if (config_.replicate_group && config_.replicate_group->size() > 1) {
    internal::CollectiveLabel label(c10::str("FSDP unit ", label_, " allreduce across replicas"));
    config_.replicate_group->allreduce(reduced)->wait();
  }
  if (config_.postdivide != 1) {
    reduced.div_(config_.postdivide);
  }
  at::Tensor& grad = shard_.mutable_grad();
  if (offloaded_) {
    // To host memory (the optimizer steps there); the copy waits for the
    // reduction's stream.
    reduced = reduced.to(at::kCPU, shard_.scalar_type());
  }
  if (grad.defined()) {
    grad.add_(reduced.to(grad.scalar_type()));
    if (!reduce_in_shared_) {
      config_.pool->recycle(reduced);
    }
  } else if (reduce_in_shared_) {
    grad = reduced.to(shard_.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  } else {
    grad = reduced.to(shard_.scalar_type());
  }
}

at::Tensor FlatUnit::gather_full_copy() {
  return gather_flat(shard_);
}

at::Tensor FlatUnit::gather_flat(const at::Tensor& shard_like) {
  torch::NoGradGuard no_grad;
  DDP_INTERNAL_ASSERT(shard_like.numel() == shard_numel_, "gather_flat of ", shard_like.numel(), " elements");
  if (shard_world_ == 1) {
    return shard_like.detach().clone();
  }
  // An offloaded shard's collective runs on the unit's GPU.
  const auto input = shard_like.detach().to(device()).contiguous();
  auto full = torch::empty({padded_numel()}, input.options().requires_grad(false));
  internal::CollectiveLabel label(c10::str("FSDP unit ", label_, " full state"));
  config_.shard_group->allgather_into_tensor(full, input)->wait();
  return full;
}

void FlatUnit::load_full(const at::Tensor& full_flat) {
  torch::NoGradGuard no_grad;
  shard_.copy_(full_flat.narrow(0, shard_rank_ * shard_numel_, shard_numel_));
  stale_ = true;
}

} // namespace ddp::fsdp
