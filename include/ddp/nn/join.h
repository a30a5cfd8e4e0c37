#pragma once

/// Join: training with uneven inputs, where ranks run out of data at
/// different steps.

#include <cstdint>

#include <torch/arg.h>

#include <ddp/nn/distributed_data_parallel.h>

namespace ddp {

/// Options of `Join`, PyTorch's `Join(..., enable, throw_on_early_termination)`
/// and `DistributedDataParallel.join(divide_by_initial_world_size, ...)`.
/// Example: `ddp::Join join(model, ddp::JoinOptions().throw_on_early_termination(true));`
struct JoinOptions {
  /// false: the Join does nothing (every rank must then have the same
  /// number of inputs), as PyTorch's `enable=False`. Default: true.
  TORCH_ARG(bool, enable) = true;
  /// true: once any rank has run out of inputs, every rank throws
  /// `c10::Error` instead of training on: a rank still training in its next
  /// forward ("detected that rank(s) 0 exhausted their inputs"), the rank
  /// that ran out in `finish()` ("this rank exhausted its inputs"); the
  /// group stays usable. Nothing is shadowed then, so
  /// divide_by_initial_world_size does not matter. Default: false.
  TORCH_ARG(bool, throw_on_early_termination) = false;
  /// true: the built-in allreduce averages each step's gradients over the
  /// whole world size, counting a finished rank's as zero (each input then
  /// weighs the same in every step); false: over the ranks still training
  /// in that step (the mean of their gradients). A registered communication
  /// hook divides as it does itself, as in PyTorch. Default: true.
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

/// While a Join lives, a rank that has run out of data "shadows" the
/// collectives of the ranks still training (buffer broadcasts, gradient
/// allreduces with zeros), so that nobody waits forever. Every rank creates
/// the Join before its training loop and calls `finish()` after it; `finish()`
/// returns once all ranks have finished, and leaves every rank with the
/// parameters and buffers of the rank that trained longest. As in PyTorch:
/// gradients are averaged over the whole world size, counting a finished
/// rank's gradients as zero (`divide_by_initial_world_size`, true by
/// default; see JoinOptions); buffers
/// are broadcast from the highest rank still training, not from rank 0; and
/// with `find_unused_parameters`, a finished rank keeps sending the
/// parameter usage of its last synchronised step, so that a parameter it
/// used then counts as used (a zero gradient on the others, not none).
///
/// Example:
/// ```
/// ddp::Join join(model);
/// for (auto& batch : my_uneven_shard) { ... model(x) ... backward ... step }
/// join.finish();
/// ```
/// `no_sync()` inside a Join is supported when all ranks still training use
/// it in the same steps.
///
/// Thread-safety: use from the training thread.
class Join {
 public:
  explicit Join(DistributedDataParallel& model, const JoinOptions& options = {});
  /// Calls `finish()` if it was not called, unless an exception is
  /// propagating (then the other ranks will fail by timeout instead, since
  /// this rank cannot take part safely). Errors are logged, never thrown.
  ~Join() noexcept;

  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// Shadows the other ranks' steps until every rank has called `finish()`,
  /// then synchronises the final parameters. Returns how many steps this
  /// rank shadowed (0 when the Join is not enabled). With
  /// throw_on_early_termination, throws when another rank is still
  /// training.
  int64_t finish();

 private:
  friend class DistributedDataParallelImpl;
  // Called at the start of every forward of a rank still training, with
  // whether this step reduces gradients and broadcasts buffers; returns the
  // rank to broadcast the buffers from.
  int on_forward(bool will_sync_gradients, bool will_sync_buffers);

  DistributedDataParallel model_;
  JoinOptions options_;
  int64_t steps_trained_ = 0;
  bool finished_ = false;
  int uncaught_at_start_ = 0;
};

} // namespace ddp
