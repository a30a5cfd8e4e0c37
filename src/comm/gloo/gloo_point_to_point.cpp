#include "comm/gloo/gloo_point_to_point.h"

#include <ATen/ATen.h>

#include <ddp/comm/error.h>

#include "comm/gloo/gloo_errors.h"

namespace ddp::internal {

PointToPointWork::~PointToPointWork() {
  std::lock_guard<std::mutex> lock(transfer_mutex_);
  if (!is_completed() && buffer_) {
    // Nobody waited: cancel so that Gloo no longer writes into the tensor.
    if (is_send_) {
      buffer_->abortWaitSend();
    } else {
      buffer_->abortWaitRecv();
    }
  }
}

void PointToPointWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kUseGroupTimeout) {
    timeout = default_timeout_;
  }
  {
    std::lock_guard<std::mutex> lock(transfer_mutex_);
    if (!is_completed()) {
      try {
        const bool done = is_send_ ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
        if (!done) {
          throw CommError(c10::str(name(), ": the transfer was aborted"));
        }
        if (!is_send_ && host_.data_ptr() != tensor_.data_ptr()) {
          tensor_.copy_(host_);
        }
        set_result({tensor_});
      } catch (const gloo::IoException& e) {
        const std::string what = e.what();
        if (classify_gloo_error(what) == GlooFailure::kTimeout) {
          set_error(std::make_exception_ptr(TimeoutError(
              c10::str(name(), ": timed out after ", timeout.count(), " ms. Gloo said: ", what))));
        } else {
          set_error(std::make_exception_ptr(
              RemoteError(c10::str(name(), ": lost connection to the peer. Gloo said: ", what), -1)));
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    }
  }
  Work::wait(timeout);
}

} // namespace ddp::internal
