#pragma once

// The byte strings DCP's ranks exchange while saving (private header):
// integers as 8 little-endian bytes, strings with their length first. A
// reader that runs out throws std::runtime_error; ranks of one job build
// these from the same code, so a short one means damage in transit.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::checkpoint::dcp::wire {

class Out {
 public:
  void i64(int64_t v) {
    for (int i = 0; i < 8; ++i) {
      bytes_ += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    }
  }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    bytes_ += s;
  }
  void dims(const std::vector<int64_t>& d) {
    i64(static_cast<int64_t>(d.size()));
    for (int64_t v : d) {
      i64(v);
    }
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class In {
 public:
  explicit In(const std::string& bytes) : bytes_(bytes) {}
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[at_ + i])) << (8 * i);
    }
    at_ += 8;
    return static_cast<int64_t>(v);
  }
  std::string str() {
    const int64_t n = i64();
    need(n);
    std::string s = bytes_.substr(at_, static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return s;
  }
  std::vector<int64_t> dims() {
    const int64_t n = i64();
    need(n < 0 ? -1 : n * 8);
    std::vector<int64_t> d(static_cast<size_t>(n));
    for (auto& v : d) {
      v = i64();
    }
    return d;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  void need(int64_t n) const {
    if (n < 0 || static_cast<uint64_t>(n) > bytes_.size() - at_) {
      throw std::runtime_error("a DCP plan from another rank ends early (damaged in transit?)");
    }
  }
  const std::string& bytes_;
  size_t at_ = 0;
};

} // namespace ddp::checkpoint::dcp::wire
