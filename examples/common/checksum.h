// A checksum of tensors' bytes, by which the examples show that two runs
// ended on bit-identical weights (a resumed run against an uninterrupted
// one: mnist_train's resume tests, scripts/chaos.py).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace examples {

// FNV-1a over tensors' bytes, fed in a fixed order.
class Checksum {
 public:
  void add(const at::Tensor& tensor) {
    const auto cpu = tensor.detach().to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(cpu.data_ptr());
    for (size_t i = 0; i < cpu.nbytes(); ++i) {
      hash_ = (hash_ ^ bytes[i]) * 0x100000001b3ull;
    }
    values_ += cpu.numel();
  }
  // 16 hexadecimal digits.
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash_));
    return text;
  }
  int64_t values() const {
    return values_;
  }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
  int64_t values_ = 0;
};

} // namespace examples
