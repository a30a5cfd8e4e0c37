#include "comm/gloo/gloo_point_to_point.h"

#include <ddp/comm/error.h>

#include "comm/gloo/gloo_errors.h"

namespace ddp::internal {

void GlooPointToPointWork::abandon_transfer() {
  if (!is_completed() && buffer_) {
    if (is_send()) {
      buffer_->abortWaitSend();
    } else {
      buffer_->abortWaitRecv();
    }
  }
}

void GlooPointToPointWork::wait_for_transfer(std::chrono::milliseconds timeout) {
  bool done = false;
  try {
    done = is_send() ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (classify_gloo_error(what) == GlooFailure::kTimeout) {
      throw TimeoutError(c10::str(name(), ": timed out after ", timeout.count(), " ms. Gloo said: ", what));
    }
    throw RemoteError(c10::str(name(), ": lost connection to the peer. Gloo said: ", what), -1);
  }
  if (!done) {
    throw CommError(c10::str(name(), ": the transfer was aborted"));
  }
}

} // namespace ddp::internal
