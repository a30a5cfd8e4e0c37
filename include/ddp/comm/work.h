#pragma once

/// `Work`: the handle of an asynchronous operation, and the future that
/// communication hooks return.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/comm/types.h>

namespace ddp {

/// The handle of an operation that completes later: a collective, a
/// point-to-point transfer, or any future built with `Work::create`.
///
/// A Work keeps the tensors it operates on alive until it completes.
/// `result()` holds the output tensors once it has completed successfully.
///
/// Thread-safety: every method may be called from any thread. Callbacks added
/// with `then` run on the thread that completes the Work (for a collective,
/// the process group's worker thread), or at once on the caller's thread when
/// the Work has already completed; they must not block on other Work.
class Work : public std::enable_shared_from_this<Work> {
 public:
  /// A Work that `set_result` or `set_error` will complete. `name` says what
  /// it is in error messages ("[rank 1/4] allreduce #12"); `default_timeout`
  /// is used by `wait()` when it is given `kUseGroupTimeout`.
  static std::shared_ptr<Work> create(
      std::string name,
      std::chrono::milliseconds default_timeout = kDefaultTimeout);

  /// A Work that has already completed with `result`.
  static std::shared_ptr<Work> completed(std::vector<at::Tensor> result);

  Work(std::string name, std::chrono::milliseconds default_timeout);
  virtual ~Work();

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  /// True once the operation has finished, successfully or not.
  bool is_completed() const;
  /// True once the operation has finished without error.
  bool is_success() const;
  /// The error the operation failed with, or null.
  std::exception_ptr exception() const;

  /// Blocks until the operation completes; rethrows its error if it failed.
  /// Throws `TimeoutError` naming the operation once `timeout` has passed
  /// (the operation itself is not cancelled by that: its own deadline
  /// applies). With the group's timeout (the default), the operation's own
  /// deadline gets up to 2 s more to fail it first, since its error names
  /// the ranks that had not reached it. For a CUDA backend, a call with the default `kUseGroupTimeout`
  /// may instead order the current stream after the operation.
  virtual void wait(std::chrono::milliseconds timeout = kUseGroupTimeout);

  /// When the Work completed (steady clock); the epoch when it has not.
  std::chrono::steady_clock::time_point completion_time() const;

  /// The output tensors. Throws unless the Work completed successfully.
  const std::vector<at::Tensor>& result() const;

  /// Returns a Work completed with `fn(result())` once this one succeeds, or
  /// with this one's error. `fn` runs on the completing thread (see class
  /// comment); an exception it throws fails the returned Work.
  std::shared_ptr<Work> then(
      std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn);

  /// Completes the Work successfully. Called by the producer exactly once.
  void set_result(std::vector<at::Tensor> result);
  /// Completes the Work with an error. Called by the producer exactly once.
  void set_error(std::exception_ptr error);

  /// What this Work is, as used in error messages.
  const std::string& name() const {
    return name_;
  }

  /// Keeps `tensors` alive until the Work completes (c10d's SendWork does
  /// the same: a buffer must outlive the transfer that reads it).
  void keep_alive(std::vector<at::Tensor> tensors);

 private:
  void complete(std::vector<at::Tensor> result, std::exception_ptr error);

  const std::string name_;
  const std::chrono::milliseconds default_timeout_;

  mutable std::mutex mutex_;
  std::condition_variable completed_cv_;
  bool completed_ = false; // guarded by mutex_
  std::chrono::steady_clock::time_point completion_time_; // guarded by mutex_
  std::exception_ptr error_; // guarded by mutex_
  std::vector<at::Tensor> result_; // guarded by mutex_
  std::vector<at::Tensor> kept_alive_; // guarded by mutex_; cleared on completion
  std::vector<std::function<void()>> callbacks_; // guarded by mutex_
};

} // namespace ddp
