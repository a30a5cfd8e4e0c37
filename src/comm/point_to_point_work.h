#pragma once

// send/recv's Work, shared by the Gloo and MPI backends (private header).
//
// Both post the transfer at once, outside their collective queue, on a host
// buffer (the tensor itself, or a pinned copy of a CUDA tensor), and complete
// it in wait() on the caller's thread. What differs is only how a transport
// waits for its transfer and how it lets go of one nobody waited for: the
// two virtual functions below.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <mutex>
#include <string>

#include <ddp/comm/work.h>

namespace ddp::internal {

// Thread-safety: as Work. wait() may be called from several threads; one of
// them waits for the transfer (under transfer_mutex_), the others for the
// Work.
class PointToPointWork : public Work {
 public:
  // The buffer a transport reads or writes for `tensor`: the tensor itself
  // when it is a contiguous CPU tensor; else a contiguous host tensor of its
  // size (pinned for a CUDA tensor), holding its values for a send, copied
  // back into it after a receive (Note [Non-contiguous arguments]). A
  // receive into a tensor whose elements share memory is refused, naming
  // `who`.
  static at::Tensor host_buffer(const at::Tensor& tensor, bool is_send, const std::string& who);

  // Waits for the transfer (wait_for_transfer, with the deadline), copies a
  // received CUDA tensor back from its host buffer, then completes the Work
  // with `tensor`, or with the transport's error.
  void wait(std::chrono::milliseconds timeout) final;

 protected:
  PointToPointWork(std::string name, std::chrono::milliseconds default_timeout, bool is_send,
                   at::Tensor tensor, at::Tensor host);

  // The transport's wait: returns when the transfer is done, throws a ddp
  // error (TimeoutError when `timeout` passed first) otherwise. Called with
  // the transfer lock held, until one call returns.
  virtual void wait_for_transfer(std::chrono::milliseconds timeout) = 0;

  // The transport's part of destruction: stop or hand off a transfer that
  // may still be pending, so that nothing writes into freed memory. Called
  // with the transfer lock held, by release_transfer().
  virtual void abandon_transfer() = 0;

  // For the derived class's destructor (a base destructor cannot reach a
  // derived override).
  void release_transfer();

  bool is_send() const { return is_send_; }
  const at::Tensor& tensor() const { return tensor_; }
  const at::Tensor& host() const { return host_; }

 private:
  const std::chrono::milliseconds default_timeout_;
  const bool is_send_;
  const at::Tensor tensor_;
  const at::Tensor host_; // tensor_ itself for a CPU tensor
  std::mutex transfer_mutex_;
};

} // namespace ddp::internal
