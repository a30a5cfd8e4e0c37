#pragma once

// Hashes that tell data apart (private header); neither is cryptographic.
// fnv1a: how ranks compare descriptions of what they built
// (ZeroRedundancyOptimizer's parameters, FullyShardedDataParallel's units)
// with one small collective. Checksum: of checkpoint files and of the
// objects that the object collectives send.

#include <cstddef>
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

// A 64-bit checksum of a byte stream fed in pieces of any size, eight bytes
// at a time (a byte at a time would cost seconds on a large optimizer state).
// It tells files apart; it is not cryptographic.
// Thread-safety: none; one per file, used by one thread.
class Checksum {
 public:
  void feed(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    total_ += size;
    while (size > 0 && carry_size_ > 0) {
      carry_[carry_size_++] = *bytes++;
      --size;
      if (carry_size_ == 8) {
        mix(load(carry_));
        carry_size_ = 0;
      }
    }
    for (; size >= 8; size -= 8, bytes += 8) {
      mix(load(bytes));
    }
    // Fewer than 8 bytes are left and carry_ is empty here; the bound says
    // so to the compiler, which cannot prove it (-Waggressive-loop-optimizations).
    while (size-- > 0 && carry_size_ < sizeof(carry_)) {
      carry_[carry_size_++] = *bytes++;
    }
  }

  uint64_t value() const {
    uint64_t h = state_;
    uint64_t tail = 0;
    for (size_t i = 0; i < carry_size_; ++i) {
      tail |= static_cast<uint64_t>(carry_[i]) << (8 * i);
    }
    h = (h ^ tail ^ total_) * kMultiplier;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
  }

  uint64_t size() const {
    return total_;
  }

 private:
  static constexpr uint64_t kMultiplier = 0x9e3779b97f4a7c15ull;

  static uint64_t load(const unsigned char* bytes) {
    uint64_t word = 0;
    for (int i = 0; i < 8; ++i) { // little-endian on every host
      word |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    }
    return word;
  }

  void mix(uint64_t word) {
    state_ = ((state_ ^ word) * kMultiplier);
    state_ = (state_ << 27) | (state_ >> 37);
  }

  uint64_t state_ = 0x243f6a8885a308d3ull;
  uint64_t total_ = 0;
  unsigned char carry_[8] = {};
  size_t carry_size_ = 0;
};

} // namespace ddp::internal
