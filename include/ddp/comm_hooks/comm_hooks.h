#pragma once

/// Communication hooks: how DistributedDataParallel reduces one bucket of
/// gradients. The default averages with one allreduce; fp16 and bf16
/// compression halve the bytes on the wire; users can register their own.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/comm/work.h>

namespace ddp {

/// One bucket of gradients, handed to a communication hook.
///
/// `buffer()` is a flat 1-D tensor holding the gradients of `parameters()`
/// back to back (`gradients()` are views into it). The exception is the
/// bucket of a sparse gradient (the weight of an Embedding or EmbeddingBag
/// with sparse(true)): it holds that one parameter, and `buffer()` (and
/// `gradients()[0]`) is its sparse COO gradient, shaped like the parameter,
/// which `ProcessGroup::allreduce` reduces where the group supports it. A
/// hook must not keep the GradBucket past its call; it may keep `buffer()`
/// (a tensor handle).
///
/// Thread-safety: immutable once made; the hook reads it on the thread
/// that calls it.
class GradBucket {
 public:
  /// `parameter_names` is shared with DistributedDataParallel's bucket, so
  /// that handing a bucket to a hook copies no strings on every step.
  GradBucket(size_t index, size_t bucket_count, at::Tensor buffer,
             std::vector<at::Tensor> gradients,
             std::shared_ptr<const std::vector<std::string>> parameter_names)
      : index_(index),
        bucket_count_(bucket_count),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameter_names_(std::move(parameter_names)) {}

  /// Position of this bucket in launch order.
  size_t index() const {
    return index_;
  }
  /// True for the last bucket of the iteration.
  bool is_last() const {
    return index_ + 1 == bucket_count_;
  }
  /// The flat gradients, this rank's local values: a hook reduces them.
  const at::Tensor& buffer() const {
    return buffer_;
  }
  /// Views into `buffer()`, one per parameter, shaped like it.
  const std::vector<at::Tensor>& gradients() const {
    return gradients_;
  }
  /// Names of the parameters whose gradients the bucket holds.
  const std::vector<std::string>& parameter_names() const {
    return *parameter_names_;
  }

 private:
  size_t index_;
  size_t bucket_count_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  std::shared_ptr<const std::vector<std::string>> parameter_names_;
};

/// A communication hook. It receives the bucket and returns a `Work` (a
/// future) whose `result()[0]` is a tensor with as many elements as
/// `bucket.buffer()`, holding the reduced gradients that every rank will use
/// (for the usual averaging: the mean over ranks); for a sparse bucket, a
/// sparse or dense tensor of the parameter's shape. Returning
/// `bucket.buffer()` itself, reduced in place, avoids a copy.
///
/// Runs on the autograd engine thread during backward. It must issue the
/// same collectives on every rank (the ProcessGroup contract).
using CommHook = std::function<std::shared_ptr<Work>(ProcessGroup& group, GradBucket& bucket)>;

/// What a stateful communication hook (PowerSGD, post-local SGD) keeps
/// between iterations, so that `save_checkpoint` can carry it: a run
/// resumed from a checkpoint then continues as the uninterrupted run would.
/// Attach it to the hook with `comm_hooks::with_state` (the hooks of
/// `<ddp/comm_hooks/powersgd_hook.h>` and `<ddp/comm_hooks/post_local_sgd_hook.h>` come
/// with theirs). Called between iterations only.
///
/// Thread-safety: not thread-safe; a derived state is used by its hook
/// during backward and by the checkpoint functions between iterations.
class CommHookState {
 public:
  virtual ~CommHookState() = default;
  /// What kind of state this is ("powerSGD"): a checkpoint's state loads
  /// only into a state of the same kind.
  virtual std::string kind() const = 0;
  /// This rank's state, as bytes that `load_state` reads back.
  virtual std::string save_state() const = 0;
  /// Replaces this rank's state with what a checkpoint holds: `saved[r]` is
  /// what rank r's `save_state` returned, for every rank of the run that
  /// saved (which may have had another size). Throws `c10::Error`, leaving
  /// the state as it was, when `saved` cannot be loaded.
  virtual void load_state(const std::vector<std::string>& saved, int rank, int world_size) = 0;
};

namespace comm_hooks {

/// `hook` with `state` attached: `register_comm_hook` finds the state, and
/// `save_checkpoint` / `load_checkpoint` carry it.
CommHook with_state(std::shared_ptr<CommHookState> state, CommHook hook);

/// The state attached to `hook` by `with_state`, or nullptr.
std::shared_ptr<CommHookState> state_of(const CommHook& hook);

/// The default: divides the bucket by the world size and allreduces it in
/// place (the mean of the ranks' gradients).
CommHook allreduce();

/// Casts the bucket to float16, divides by the world size, allreduces, and
/// casts back. Halves the bytes sent; values beyond float16's range
/// (about 65504) overflow. In a world of size 1 nothing is sent, so nothing
/// is compressed either (PyTorch would still round to float16).
CommHook fp16_compress();

/// Like fp16_compress with bfloat16: float32's range, 8 bits of mantissa.
CommHook bf16_compress();

} // namespace comm_hooks

} // namespace ddp
