#pragma once

// The one free_port of the tests (free_port.cpp; no Torch, so that a test
// linking only some of the library's parts can use it). Shell tests have
// testing/free_port.sh.

namespace ddp::testing {

// A TCP port on loopback that was free a moment ago (the kernel picks it),
// or -1.
int free_port();

} // namespace ddp::testing
