#pragma once

// Which Gloo a running ddp uses (private header, for tests and diagnostics).
// See cmake/gloo.cmake and docs/design.md, "Two Gloos in one process".

#include <string>

namespace ddp::internal {

struct GlooOrigin {
  // The shared object that holds gloo::allreduce as ddp calls it.
  std::string algorithms;
  // The shared object that holds the vtable of the TCP device that ddp
  // creates: the code that Gloo's own virtual calls run.
  std::string transport;
};

// Looks both up with dladdr. Creates (and drops) a TCP device on loopback.
GlooOrigin gloo_origin();

} // namespace ddp::internal
