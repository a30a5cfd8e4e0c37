#pragma once

// The one reading of Gloo's error messages (private header).
//
// Gloo reports a deadline that passed and a peer that closed its connection
// alike, as gloo::IoException, told apart only by the message's words. Both
// the group's workers (collectives) and point-to-point transfers turn them
// into ddp's TimeoutError or RemoteError through this function, so that the
// two can never read the same message differently.

#include <string>

namespace ddp::internal {

enum class GlooFailure {
  kTimeout,        // a deadline passed: "Timed out waiting ...", "... timeout ..."
  kConnectionLost, // anything else: a peer closed or reset its connection
};

// Which failure Gloo's exception message `what` describes.
GlooFailure classify_gloo_error(const std::string& what);

} // namespace ddp::internal
