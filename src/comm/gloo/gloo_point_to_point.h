#pragma once

// send/recv of the Gloo backend (private header): posted at once on Gloo's
// unbound buffers, outside the group's task queue, and completed in
// Work::wait on the caller's thread (the shared part: comm/point_to_point_work.h).

#include <chrono>
#include <memory>
#include <string>

#include "comm/gloo/gloo_api.h"
#include "comm/point_to_point_work.h"

namespace ddp::internal {

// Gloo's unbound buffers post the transfer at once and report completion
// through waitSend/waitRecv.
class DDP_GLOO_HIDDEN GlooPointToPointWork : public PointToPointWork {
 public:
  GlooPointToPointWork(std::string name, std::chrono::milliseconds default_timeout, bool is_send,
                       at::Tensor tensor, at::Tensor host,
                       std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
      : PointToPointWork(std::move(name), default_timeout, is_send, std::move(tensor),
                         std::move(host)),
        buffer_(std::move(buffer)) {}

  ~GlooPointToPointWork() override { release_transfer(); }

 private:
  // waitSend/waitRecv with the deadline; Gloo's IoException becomes a
  // TimeoutError or a RemoteError (classify_gloo_error).
  void wait_for_transfer(std::chrono::milliseconds timeout) override;
  // Cancels a transfer nobody waited for, so that Gloo no longer touches
  // the tensor.
  void abandon_transfer() override;

  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_; // guarded by the transfer lock
};

} // namespace ddp::internal
