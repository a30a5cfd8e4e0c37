#pragma once

/// PowerSGD: a communication hook that sends a rank-r approximation of each
/// gradient matrix instead of the matrix (Vogels et al., "PowerSGD: Practical
/// Low-Rank Gradient Compression for Distributed Optimization", 2019), with
/// PyTorch's `PowerSGDState` / `powerSGD_hook` semantics. See docs/ddp.md,
/// "PowerSGD".

#include <torch/arg.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ddp/comm_hooks/comm_hooks.h>

namespace ddp::comm_hooks {

/// Options of PowerSGD, PyTorch's names and defaults.
/// Example:
/// ```
/// auto state = std::make_shared<ddp::comm_hooks::PowerSGDState>(
///     ddp::comm_hooks::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(100));
/// model->register_comm_hook(ddp::comm_hooks::powerSGD(state));
/// ```
struct PowerSGDOptions {
  /// The rank r of the approximation P Q^T of each compressed gradient
  /// matrix: the lower, the fewer bytes and the coarser the gradient.
  /// Default: 1.
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  /// Iterations (backward passes) reduced with the plain averaging allreduce
  /// before compression starts. Must be at least 2 with error feedback or
  /// warm start: DDP rebuilds its buckets after the first iteration, and the
  /// memories are kept per bucket. Default: 1000.
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  /// A gradient of n x m elements (its first dimension by the product of the
  /// rest) is compressed only when (n + m) * r * min_compression_rate <
  /// n * m; others (every bias: n x 1) are averaged uncompressed. Default: 2.
  TORCH_ARG(double, min_compression_rate) = 2.0;
  /// Add to each gradient what compression lost from it in the previous
  /// iteration (kept per bucket, on this rank). Default: true.
  TORCH_ARG(bool, use_error_feedback) = true;
  /// Start each iteration's power iteration from the previous iteration's Q
  /// instead of a fresh random one. Default: true.
  TORCH_ARG(bool, warm_start) = true;
  /// Added to each column norm in the Gram-Schmidt orthogonalization; 0
  /// (PyTorch's default) divides by zero when a column is all zeros, e.g. 1e-8
  /// prevents it. Default: 0.
  TORCH_ARG(double, orthogonalization_epsilon) = 0.0;
  /// Seeds the random initial Q, the same on every rank. The draws match
  /// PyTorch's for the same seed (its NumPy RandomState picks a torch seed per
  /// initialisation). Default: 0.
  TORCH_ARG(uint32_t, random_seed) = 0;
  /// Compress the gradient matrices of one shape in a bucket as one batch
  /// (one batched matrix product instead of one per matrix: faster when
  /// compression is the bottleneck; a larger bucket_cap_mb puts more
  /// matrices of a shape in one bucket). The same values as without, up to
  /// rounding. Default: false.
  TORCH_ARG(bool, batch_tensors_with_same_shape) = false;
};

/// What compression saved since the state was made, as PyTorch's
/// `PowerSGDState.compression_stats()`: element counts of the gradients the
/// hook compressed or passed through, from the first compressed iteration.
struct PowerSGDCompressionStats {
  /// numel_before / numel_after; 0 before the first compressed iteration.
  double rate = 0;
  int64_t numel_before = 0;
  int64_t numel_after = 0;
};

/// The state that the invocations of one `powerSGD` hook share: the options,
/// the iteration count, and per bucket the error of the last compression and
/// the Q memory of the warm start. One state belongs to one
/// DistributedDataParallel model (it is keyed by bucket index).
///
/// Thread-safety: the hook runs on the autograd engine thread, and its
/// decompression step on the process group's thread; the accessors below may
/// be called from any thread (they read atomics), the memories only between
/// iterations.
class PowerSGDState : public CommHookState {
 public:
  /// Throws `c10::Error` for a rank below 1, a `start_powerSGD_iter` below 2
  /// with error feedback or warm start, or a negative epsilon or rate.
  explicit PowerSGDState(PowerSGDOptions options = {});
  ~PowerSGDState();

  PowerSGDState(const PowerSGDState&) = delete;
  PowerSGDState& operator=(const PowerSGDState&) = delete;

  const PowerSGDOptions& options() const {
    return options_;
  }
  /// Iterations seen so far (counted at each iteration's last bucket).
  int64_t iteration() const {
    return iteration_.load();
  }
  /// Bytes that this rank has passed to allreduce since the state was made:
  /// the payload of every allreduce the hook issued (plain buckets before
  /// `start_powerSGD_iter`, then uncompressed tensors, P and Q). Counted in a
  /// world of size 1 too, where nothing is sent.
  uint64_t bytes_allreduced() const {
    return bytes_allreduced_.load();
  }
  /// Allreduce calls issued, counted like `bytes_allreduced`.
  uint64_t allreduce_calls() const {
    return allreduce_calls_.load();
  }
  PowerSGDCompressionStats compression_stats() const;

  /// This rank's error feedback for a bucket (what the last compression lost
  /// from its local gradients), or an undefined tensor before the first
  /// compression. Call between iterations.
  at::Tensor error(size_t bucket_index) const;

  /// CommHookState: what `save_checkpoint` keeps of the state (the
  /// iteration, the random generator, the statistics, and per bucket the
  /// error feedback and the warm-start Q, with the names of the bucket's
  /// parameters) and how `load_checkpoint` restores it. A state loads only
  /// what a state of the same options saved (a c10::Error names the first
  /// option that differs). From a run of another size, every rank takes
  /// rank 0's state without its error feedback (which was per rank), and
  /// rank 0 logs a warning. A saved bucket whose parameters differ from
  /// this model's bucket of the same index starts afresh (a warning says so).
  std::string kind() const override;
  std::string save_state() const override;
  void load_state(const std::vector<std::string>& saved, int rank, int world_size) override;

 private:
  friend CommHook powerSGD(std::shared_ptr<PowerSGDState> state);

/// PowerSGD on the whole bucket (PyTorch's `batched_powerSGD_hook`): the
/// bucket's flat gradients, padded with zeros to the next square, are one
/// matrix of side ceil(sqrt(numel)), compressed to rank
/// min(matrix_approximation_rank, side); no `min_compression_rate`, no
/// uncompressed tensors. Coarser than `powerSGD` (one approximation mixes
/// every layer of the bucket) and faster; error feedback and warm start as
/// there (the error keeps the padding's share, as PyTorch's does). Its
/// state must not be shared with a `powerSGD` hook.
CommHook batched_powerSGD(std::shared_ptr<PowerSGDState> state);
  friend CommHook batched_powerSGD(std::shared_ptr<PowerSGDState> state);
  struct BucketMemory;
  struct InFlight;

  std::shared_ptr<Work> run_hook(ProcessGroup& group, GradBucket& bucket);
  std::shared_ptr<Work> run_batched_hook(ProcessGroup& group, GradBucket& bucket);
  std::shared_ptr<Work> plain_allreduce(ProcessGroup& group, GradBucket& bucket);
  // Before start_powerSGD_iter, or for a sparse bucket: the plain average
  // (counting the iteration); nullptr when the bucket is to be compressed.
  std::shared_ptr<Work> plain_unless_compressing(ProcessGroup& group, GradBucket& bucket);
  // Allreduces `current->first`, makes the bucket's Work and chains it.
  std::shared_ptr<Work> launch(ProcessGroup& group, std::unique_ptr<InFlight> current, const char* hook, bool last);
  // Waits for the first allreduce; false (and the bucket's Work failed) if it failed.
  static bool first_completed(InFlight& bucket);
  // The bucket's memory, made or (from a checkpoint) restored for its
  // parameters. See Note [PowerSGD memories across layouts].
  std::shared_ptr<BucketMemory>& memory_for(const GradBucket& bucket, bool batched);
  // Hands the previous bucket's second half on (see Note [PowerSGD
  // collective order]), then `current`'s if it is the iteration's last.
  void chain(ProcessGroup& group, std::unique_ptr<InFlight> current, bool last);
  void finish(ProcessGroup& group, InFlight& bucket);
  void finish_batched(ProcessGroup& group, InFlight& bucket);
  uint32_t next_seed();

  const PowerSGDOptions options_;
  // NumPy's legacy RandomState draws a torch seed from this MT19937 (see
  // next_seed); only the hook thread uses it.
  std::mt19937 seed_rng_;
  std::atomic<int64_t> iteration_{0};
  std::atomic<uint64_t> bytes_allreduced_{0};
  std::atomic<uint64_t> allreduce_calls_{0};
  std::atomic<int64_t> numel_before_{0};
  std::atomic<int64_t> numel_after_{0};
  // By bucket index. The map is changed only on the hook thread; each
  // memory's tensors are written by its bucket's decompression, which the
  // next iteration's hook call follows (DDP waits for every bucket first).
  std::map<size_t, std::shared_ptr<BucketMemory>> memories_;
  // Memories that load_state restored and no bucket has claimed yet.
  std::vector<std::shared_ptr<BucketMemory>> restored_;
  // The bucket whose P allreduce is in flight and whose second half (Q)
  // the next hook call issues. See Note [PowerSGD collective order].
  std::unique_ptr<InFlight> in_flight_;
};

/// PowerSGD (PyTorch's `powerSGD_hook`). For `start_powerSGD_iter`
/// iterations it averages like `allreduce()`. Then, per bucket: it adds the
/// error feedback, averages the tensors not worth compressing (vectors, small
/// matrices) uncompressed, and for each gradient matrix M (n x m) computes
/// P = M Q, allreduces P, orthogonalizes it, computes Q = M^T P, allreduces Q,
/// and writes M = P Q^T / world_size. A sparse bucket is averaged as by
/// `allreduce()`. Compression runs in a world of size 1 too (so that one
/// process reproduces W ranks). The state must outlive the model's backward
/// passes; the hook holds it.
CommHook powerSGD(std::shared_ptr<PowerSGDState> state);

/// PowerSGD on the whole bucket (PyTorch's `batched_powerSGD_hook`): the
/// bucket's flat gradients, padded with zeros to the next square, are one
/// matrix of side ceil(sqrt(numel)), compressed to rank
/// min(matrix_approximation_rank, side); no `min_compression_rate`, no
/// uncompressed tensors. Coarser than `powerSGD` (one approximation mixes
/// every layer of the bucket) and faster; error feedback and warm start as
/// there (the error keeps the padding's share, as PyTorch's does). Its
/// state must not be shared with a `powerSGD` hook.
CommHook batched_powerSGD(std::shared_ptr<PowerSGDState> state);

} // namespace ddp::comm_hooks
