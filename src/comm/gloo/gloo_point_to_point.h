#pragma once

// send/recv of the Gloo backend (private header): posted at once on Gloo's
// unbound buffers, outside the group's task queue, and completed in
// Work::wait on the caller's thread.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <ddp/comm/work.h>

#include "comm/gloo/gloo_api.h"

namespace ddp::internal {

// send/recv complete when waited on: Gloo's unbound buffers post the
// transfer at once and report completion through waitSend/waitRecv.
class DDP_GLOO_HIDDEN PointToPointWork : public Work {
 public:
  PointToPointWork(std::string name, std::chrono::milliseconds default_timeout, bool is_send,
                   at::Tensor tensor, at::Tensor host,
                   std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
      : Work(std::move(name), default_timeout),
        default_timeout_(default_timeout),
        is_send_(is_send),
        tensor_(std::move(tensor)),
        host_(std::move(host)),
        buffer_(std::move(buffer)) {}

  // Cancels a transfer nobody waited for, so that Gloo no longer touches
  // the tensor.
  ~PointToPointWork() override;

  // Waits for the transfer (Gloo's waitSend/waitRecv, with the deadline),
  // copies a received CUDA tensor back from its host buffer, then completes.
  void wait(std::chrono::milliseconds timeout) override;

 private:
  const std::chrono::milliseconds default_timeout_;
  const bool is_send_;
  at::Tensor tensor_;
  at::Tensor host_;
  std::mutex transfer_mutex_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_; // guarded by transfer_mutex_
};


} // namespace ddp::internal
