#pragma once

// What the two PowerSGD hooks (powersgd_hook.cpp, batched_powersgd_hook.cpp)
// and their state (powersgd_state.cpp) share. Private.

#include <ddp/comm_hooks/powersgd_hook.h>

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp::comm_hooks {

namespace internal {

// The Work a PowerSGD hook call returns before the collective that completes
// it (the Q allreduce) has been issued. `set_inner` names the Work whose
// success completes this one (its callback calls set_result); if it fails
// instead, `wait` passes its error on, so that DDP's wait does not sit out
// the timeout.
class ChainedWork : public Work {
 public:
  using Work::Work;

  void set_inner(std::shared_ptr<Work> inner);
  void wait(std::chrono::milliseconds timeout) override;

 private:
  std::mutex inner_mutex_;
  std::shared_ptr<Work> inner_; // guarded by inner_mutex_
};

// Makes the columns of each matrix of `matrices` (b x k x r) orthonormal in
// place, as PyTorch's _orthogonalize: Gram-Schmidt for r <= 2 (or half
// precision), else QR. `epsilon` is added to each column norm.
void orthogonalize(const at::Tensor& matrices, double epsilon);

// The second half of a bucket: allreduces `q` (nothing to send in a world of
// size 1) and has `decompress` complete `result` once that is done; a
// failure to issue it fails `result`.
void send_q(ProcessGroup& group, const std::shared_ptr<ChainedWork>& result, const at::Tensor& q,
            std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> decompress);

// "[rank R/W] powerSGD bucket I".
std::string work_name(const ProcessGroup& group, const char* hook, size_t bucket_index);

} // namespace internal

// The memory of one bucket: the layout it belongs to (its parameters' names
// and which hook), the error feedback and the warm-start Q.
struct PowerSGDState::BucketMemory {
  std::vector<std::string> names;
  bool batched = false;
  at::Tensor q;     // powerSGD: every compressed matrix's Q back to back; batched: side x r
  at::Tensor error; // flat, like the bucket (batched: padded to side * side)
};

// One bucket between its P allreduce and its Q allreduce.
struct PowerSGDState::InFlight {
  size_t index = 0;
  bool batched = false;
  std::shared_ptr<BucketMemory> memory;
  at::Tensor buffer;     // the bucket: the result is written here
  at::Tensor input_copy; // M before compression (error feedback only)
  at::Tensor first;      // powerSGD: [uncompressed tensors | every P]; batched: P
  int64_t uncompressed_numel = 0;
  std::vector<at::Tensor> uncompressed; // views of buffer
  // The compressed matrices, b x n x m each: one matrix (b = 1, a view of
  // buffer) or, with batch_tensors_with_same_shape, a stack of the
  // `originals` of one shape (a copy, written back at decompression).
  std::vector<at::Tensor> matrices;
  std::vector<std::vector<at::Tensor>> originals;
  std::vector<at::Tensor> ps; // views of first, b x n x r
  std::vector<at::Tensor> qs; // views of memory->q, b x m x r
  at::Tensor square;          // batched: the padded bucket, side x side
  std::shared_ptr<Work> first_work;
  std::shared_ptr<internal::ChainedWork> result;
};

} // namespace ddp::comm_hooks
