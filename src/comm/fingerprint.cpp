// Note [Collective fingerprints]
// Ranks that call different collectives at the same point of their sequence
// (other sizes, dtypes, reduce ops, roots, or another collective altogether)
// must never exchange data: with Gloo, a size mismatch aborts the process
// inside Gloo's event loop or, worse, returns a partly reduced tensor. So
// every Gloo collective is tagged with its sequence number and a hash of its
// fingerprint (fingerprint_tag): mismatched calls use different tags, their
// messages never meet, and each side waits. The group's monitor thread then
// notices a collective that has run for a while, publishes its fingerprint
// to the store and compares it with the other ranks' (FingerprintExchange):
// on a difference, every rank fails the collective with both fingerprints
// in the message, and the group's connections are closed so that the stuck
// collective ends at once instead of at its deadline.
//
// The cost on the normal path is nothing but computing a hash: no extra
// message, no store access for collectives that finish within the monitor's
// delay. What is left: two different calls whose 16-bit hashes are equal
// (one chance in 65536 per mismatched call) still meet, as without
// fingerprints.

#include "comm/fingerprint.h"

#include <c10/util/StringUtil.h>

#include <algorithm>

namespace ddp::internal {

namespace {

// FNV-1a over the bytes of a string.
uint32_t fnv1a(const std::string& text) {
  uint32_t hash = 2166136261u;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 16777619u;
  }
  return hash;
}

std::string dtype_name(at::ScalarType dtype) {
  // c10's names ("Float") as torch.distributed users know them ("float32").
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

} // namespace

std::string Fingerprint::shape() const {
  std::string text = dtype ? c10::str(dtype_name(*dtype), "[", numel, "]") : std::string("no tensor");
  if (reduce) {
    text += " " + to_string(*reduce);
  }
  if (root >= 0) {
    text += c10::str(" root ", root);
  }
  return text;
}

std::string Fingerprint::describe() const {
  return c10::str(op, " #", seq, " with ", shape());
}

uint16_t Fingerprint::hash16() const {
  const uint32_t hash = fnv1a(op + "|" + shape());
  return static_cast<uint16_t>(hash ^ (hash >> 16));
}

uint32_t fingerprint_tag(const Fingerprint& fingerprint) {
  return (static_cast<uint32_t>(fingerprint.seq & 0xFFFF) << 16) | fingerprint.hash16();
}

FingerprintExchange::FingerprintExchange(std::shared_ptr<Store> store, std::string prefix, int rank,
                                         int size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}

std::string FingerprintExchange::key(uint64_t seq, int rank) const {
  return c10::str(prefix_, seq, "/", rank);
}

std::optional<std::string> FingerprintExchange::publish_and_compare(const Fingerprint& fingerprint) {
  const std::string mine = fingerprint.op + "|" + fingerprint.shape();
  if (published_ != fingerprint.seq) {
    store_->set(key(fingerprint.seq, rank_), mine);
    published_ = fingerprint.seq;
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !store_->check({key(fingerprint.seq, r)})) {
      continue;
    }
    const std::string theirs = store_->get_string(key(fingerprint.seq, r));
    if (theirs != mine) {
      const auto bar = theirs.find('|');
      const std::string their_op = bar == std::string::npos ? theirs : theirs.substr(0, bar);
      const std::string their_shape = bar == std::string::npos ? "" : theirs.substr(bar + 1);
      const std::string this_rank = their_op == fingerprint.op
                                        ? fingerprint.shape()
                                        : c10::str(fingerprint.op, " #", fingerprint.seq, " with ",
                                                   fingerprint.shape());
      return c10::str("rank ", r, " called ", their_op, " #", fingerprint.seq, " with ", their_shape,
                      ", this rank ", this_rank);
    }
  }
  return std::nullopt;
}

std::vector<int> FingerprintExchange::ranks_missing(uint64_t seq) {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !store_->check({key(seq, r)})) {
      missing.push_back(r);
    }
  }
  return missing;
}

} // namespace ddp::internal
