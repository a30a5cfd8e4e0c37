#pragma once

// FNV-1a over a string: how ranks compare descriptions of what they built
// (ZeroRedundancyOptimizer's parameters, FullyShardedDataParallel's units)
// with one small collective (private header). It tells texts apart; it is
// not cryptographic.

#include <cstdint>
#include <string>

namespace ddp::internal {

inline uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (const unsigned char c : text) {
    hash = (hash ^ c) * 1099511628211ULL;
  }
  return hash;
}

} // namespace ddp::internal
