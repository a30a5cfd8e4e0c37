#pragma once

// One unit of FullyShardedDataParallel: its parameters flattened into one
// padded buffer, of which this rank keeps one shard (private header).
//
// How it works. The unit's parameters p_0 .. p_k-1 (T elements in all) are
// laid end to end and padded to W * S elements, S = ceil(T / W), W the
// shard group's size. Rank r keeps elements [r * S, (r + 1) * S) in
// `shard`, the tensor the optimizer steps (registered on the FSDP module).
// Gathering allocates `full` (W * S elements, in the compute dtype) and
// all-gathers every rank's shard into it; the parameters are then pointed
// (set_data) at views of `full`, so that the wrapped modules compute with
// them unchanged. Freeing points the parameters at empty tensors and drops
// `full`'s memory while keeping its storage object: the views that autograd
// saved during forward (a Linear saves `weight.t()`) see the memory again
// when the next gather refills the same storage before backward. See
// Note [Refilled storage].
//
// Worked example, W = 2, a Linear(3, 2): weight 6 elements, bias 2, T = 8,
// S = 4: rank 0 keeps weight[0..3], rank 1 weight[4..5] and the bias. A
// Linear(4, 1) has T = 5: S = 3, and rank 1's last element is padding,
// which stays zero (its gradient is always zero).
//
// Gradients: each parameter's AccumulateGrad gets a post hook; when every
// parameter of the unit has its gradient, the unit is ready and its owner
// (the FSDP state) starts `start_reduce`: the gradients are copied into one
// flat buffer (zeros where a parameter got none, and in the padding),
// divided by the pre-divide factor, and reduce-scattered, asynchronously;
// `finish_reduce` waits, all-reduces across the replicate group (hybrid
// and no-shard), applies the post-divide factor and adds the result to
// `shard`'s gradient.
//
// Thread-safety: none; used from the training thread and the autograd
// engine's thread, which do not run at the same time.

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

#include "fsdp/buffer_pool.h"
#include "internal/torch_compat.h"

namespace ddp::fsdp {

// Gloo or MPI with the ranks on one host: the reductions' gradient buffers
// are memory that every rank maps, and the reduce-scatter reads each rank's
// shard of every peer's buffer where it lies and sums it into its own, in
// place (Note [Shared buffers], "Reduce-scatter"): each byte read once, no
// message but two barriers, nothing copied back. When the slots could not
// be shared (/dev/shm full, DDP_GLOO_SHM=0) the reduce-scatter sends
// messages as elsewhere. Slots are used in turn, one more than the
// reductions in flight, so that a slot is never refilled while a peer may
// still read it. Allocated (a collective) at the first reduction, which
// every rank makes at the same point.
// One more slot than FullyShardedDataParallel keeps reductions in flight
// (kReductionsInFlight, fsdp_state.h).
constexpr size_t kSharedReduceSlots = 3;

struct SharedReduceBuffers {
  int64_t numel = 0; // the largest unit's padded size
  at::ScalarType dtype = at::kFloat;
  std::vector<at::Tensor> slots;
  size_t next = 0;
  bool usable = false; // the slots are in shared memory
  // Units gather into common memory (Note [Gathered in common memory]):
  // decided by every rank together, at construction.
  bool common_gather = false;
};

// What every unit of one FSDP module shares.
struct UnitConfig {
  std::string who; // "[rank R/W] FullyShardedDataParallel"
  // The group parameters are sharded over; nullptr: this rank alone.
  std::shared_ptr<ProcessGroup> shard_group;
  // The group gradients are all-reduced over after the reduce-scatter;
  // nullptr: none.
  std::shared_ptr<ProcessGroup> replicate_group;
  c10::optional<at::ScalarType> param_dtype;
  c10::optional<at::ScalarType> reduce_dtype;
  double predivide = 1;
  double postdivide = 1;
  // Shared by the units: gathered parameters and gradient buffers.
  std::shared_ptr<BufferPool> pool;
  // Set when the shard group reduces_in_shared_memory() (Gloo, MPI): see
  // SharedReduceBuffers.
  std::shared_ptr<SharedReduceBuffers> shared_reduce;
  // CPUOffload.offload_params: shards of units on a GPU live in host memory.
  bool offload_params = false;
};

// One parameter's place in the flat buffer.
struct FlatEntry {
  std::string name; // the first name under which the module holds it
  at::Tensor param; // the module's own tensor (its TensorImpl is kept)
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
  // Laid out by take_shard: shape and numel set, `param` already empty.
  bool laid_out = false;
};

// For a unit built late (a deferred FsdpUnit): lays `entries` out as
// FlatUnit does, returns this rank's shard of their values (`rank` of
// `world`; only the overlapping slices are copied), and points each
// parameter at an empty tensor of its dtype and device, so that the unit's
// full values can go. FlatUnit then takes the shard.
at::Tensor take_shard(std::vector<FlatEntry>& entries, int world, int rank);

class FlatUnit {
 public:
  enum class State { kSharded, kGathering, kGathered };

  // Takes `params` (distinct tensors, one dtype and device) and keeps this
  // rank's shard of their current values; the parameters are left empty.
  // With `shard` (of take_shard), the entries are laid out already and
  // their shard is `shard`.
  FlatUnit(std::string label, std::vector<FlatEntry> entries, const UnitConfig& config, at::Tensor shard = {});
  ~FlatUnit();
  FlatUnit(const FlatUnit&) = delete;
  FlatUnit& operator=(const FlatUnit&) = delete;

  const std::string& label() const { return label_; }
  const std::vector<FlatEntry>& entries() const { return entries_; }
  at::Tensor& shard() { return shard_; }
  // Where the unit computes (its gathered parameters), and where tensors
  // for its collectives go: the shard's device unless it is offloaded.
  c10::Device device() const { return full_.device(); }
  // The shard lives in host memory while the unit computes on a GPU.
  bool offloaded() const { return offloaded_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t padded_numel() const { return shard_numel_ * shard_world_; }
  // This rank's shard is elements [shard_rank() * shard_numel(), +
  // shard_numel()) of the padded flat buffer.
  int shard_rank() const { return shard_rank_; }
  int shard_world() const { return shard_world_; }
  State state() const { return state_; }

  // Starts gathering into `full` (refilling it when already gathered but
  // stale). Asynchronous; `wait_gather` finishes it.
  void start_gather();
  // Finishes a gather, and points the parameters at views of `full`.
  void wait_gather();
  // Gathered and up to date with the shard, whatever the state was.
  void ensure_gathered();
  // The shard changed (an optimizer step, a load): the next use re-gathers.
  void mark_stale() { stale_ = true; }
  bool fresh() const { return state_ != State::kSharded && !stale_; }
  // Points the parameters at empty tensors and releases `full`'s memory.
  void free_full();

  // Hooks every parameter's gradient accumulator (again where autograd
  // replaced it); `on_ready` runs on the autograd thread once every
  // parameter of the unit has its gradient in a backward pass.
  void hook_gradients(std::function<void()> on_ready);
  void reset_backward() { grads_seen_ = 0; }

  // Copies the parameters' gradients into a flat buffer, drops them, and
  // starts the reduce-scatter. See the narrative above.
  void start_reduce();
  // Waits for the reduction and adds it to the shard's gradient.
  void finish_reduce();

  // The whole unit, in the shard's dtype, gathered from every rank's shard:
  // a collective over the shard group.
  at::Tensor gather_full_copy();
  // The same for a tensor shaped as the shard (an optimizer's exp_avg of
  // it): every rank's, end to end (padded_numel() elements). A collective.
  at::Tensor gather_flat(const at::Tensor& shard_like);
  // Sets the shard from the full values (padded_numel() elements).
  void load_full(const at::Tensor& full_flat);

 private:
  void allocate_full();
  void release_full();
  // start_gather's form when `full_` is common memory.
  void gather_in_common();
  void point_params_at_full();

  std::string label_;
  std::vector<FlatEntry> entries_;
  UnitConfig config_;
  int shard_world_ = 1;
  int shard_rank_ = 0;
  int64_t total_numel_ = 0;
  int64_t shard_numel_ = 0;
  at::ScalarType compute_dtype_;
  at::ScalarType reduce_dtype_;
  bool offloaded_ = false;

  at::Tensor shard_;
  at::Tensor full_;  // its storage outlives every free; see Note [Refilled storage]
  at::Tensor empty_; // what freed parameters point at
  State state_ = State::kSharded;
  bool stale_ = true;
  // `full_` is memory every rank maps (Note [Gathered in common memory]).
  bool common_ = false;
  at::Tensor gather_input_;
  // Mixed precision on MPI: where the shard is cast for its all-gather
  // (Note [Shards in mapped memory], flat_unit.cpp).
  at::Tensor gather_source_;
  std::shared_ptr<Work> gather_work_;

  std::vector<internal::AutogradNodePtr> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::function<void()> on_ready_;
  size_t grads_seen_ = 0;

  at::Tensor reduce_in_;
  at::Tensor reduce_out_;
  bool reduce_in_shared_ = false; // reduce_in_ is a SharedReduceBuffers slot
  std::shared_ptr<Work> reduce_work_;
};

} // namespace ddp::fsdp
