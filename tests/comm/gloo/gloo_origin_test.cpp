// Which Gloo runs inside a ddp program (docs/design.md, "Two Gloos in one
// process"). With a PyPI LibTorch, whose libtorch_cpu.so exports a Gloo of
// its own, ddp must run the private Gloo compiled into libddp.so, both its
// algorithms and the transport code that Gloo reaches through virtual calls;
// with Debian's LibTorch, the one shared libgloo that LibTorch links too.
// Never LibTorch's copy.

#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "comm/gloo/gloo_origin.h"

namespace ddp {
namespace {

TEST(GlooOrigin, DdpRunsTheGlooItWasBuiltWith) {
  const auto origin = internal::gloo_origin();
  std::cout << "gloo::allreduce runs from " << origin.algorithms << "\n"
            << "the TCP transport runs from " << origin.transport << "\n";
#ifdef DDP_PRIVATE_GLOO
  const char* expected = "libddp.so";
#else
  const char* expected = "libgloo.so";
#endif
  EXPECT_NE(origin.algorithms.find(expected), std::string::npos) << origin.algorithms;
  EXPECT_NE(origin.transport.find(expected), std::string::npos) << origin.transport;
  EXPECT_EQ(origin.algorithms.find("libtorch"), std::string::npos) << origin.algorithms;
  EXPECT_EQ(origin.transport.find("libtorch"), std::string::npos) << origin.transport;
}

} // namespace
} // namespace ddp
