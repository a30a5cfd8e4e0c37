#include "comm/gloo/gloo_errors.h"

namespace ddp::internal {

GlooFailure classify_gloo_error(const std::string& what) {
  // Gloo's TCP transport says "Timed out waiting <n>ms for recv operation to
  // complete" (pairs and unbound buffers), its rendezvous and older
  // versions "timed out" or "timeout"; a closed connection says "Connection
  // closed by peer", "Connection reset by peer" or "Broken pipe".
  if (what.find("imed out") != std::string::npos || what.find("timeout") != std::string::npos) {
    return GlooFailure::kTimeout;
  }
  return GlooFailure::kConnectionLost;
}

} // namespace ddp::internal
