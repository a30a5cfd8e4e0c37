#include <ddp/comm/error.h>

#include "comm/objects/object_frame.h"

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstring>
#include <vector>

#include "internal/check.h"
#include "internal/hash.h"

namespace ddp::internal {

// Note [Object frames]
// Every object an object collective sends is
//   bytes  0..8   "DDPOBJ" 0x01 0x00 (magic and format version)
//   bytes  8..16  kind: 1 a pickled IValue, 2 raw bytes (little-endian)
//   bytes 16..24  payload length in bytes
//   bytes 24..32  checksum of the payload (internal/hash.h's Checksum)
//   bytes 32..    the payload: torch::jit::pickle_save's bytes (what
//                 Python's torch.load reads) or the caller's bytes.
// The receiver checks the size it was told against the header's length,
// the magic, the kind and the checksum before it unpickles anything, and
// wraps the unpickler's own errors: a damaged object names its sender.

namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'O', 'B', 'J', 1, 0};

void put_u64(char* at, uint64_t value) {
  for (int i = 0; i < 8; ++i) {
    at[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

uint64_t get_u64(const uint8_t* at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= static_cast<uint64_t>(at[i]) << (8 * i);
  }
  return value;
}

uint64_t checksum_of(const void* data, size_t size) {
  Checksum checksum;
  checksum.feed(data, size);
  return checksum.value();
}

} // namespace

std::string frame_object(ObjectKind kind, const void* payload, size_t size) {
  std::string frame(kObjectHeaderBytes + size, '\0');
  std::memcpy(&frame[0], kMagic, sizeof(kMagic));
  put_u64(&frame[8], static_cast<uint64_t>(kind));
  put_u64(&frame[16], size);
  put_u64(&frame[24], checksum_of(payload, size));
  if (size > 0) {
    std::memcpy(&frame[kObjectHeaderBytes], payload, size);
  }
  return frame;
}

std::string unframe_object(const uint8_t* data, size_t size, ObjectKind expected, const std::string& who,
                           const std::string& from) {
  const auto damaged = [&](const std::string& why) {
    return c10::str(who, ": the object from ", from, " is damaged: ", why);
  };
  DDP_CHECK(size >= kObjectHeaderBytes, damaged(c10::str(size, " bytes arrived, fewer than the ",
                                                        kObjectHeaderBytes, "-byte header")));
  DDP_CHECK(std::memcmp(data, kMagic, sizeof(kMagic)) == 0,
            damaged("it does not start with ddp's object header (was it sent by an object collective of "
                    "this version of ddp?)"));
  const uint64_t kind = get_u64(data + 8);
  DDP_CHECK(kind == static_cast<uint64_t>(expected),
            damaged(c10::str("it holds ", kind == 1 ? "an IValue" : kind == 2 ? "raw bytes" : "an unknown kind",
                             ", expected ", expected == ObjectKind::kIValue ? "an IValue" : "raw bytes",
                             " (every rank must call the same form)")));
  const uint64_t length = get_u64(data + 16);
  DDP_CHECK(length == size - kObjectHeaderBytes,
            damaged(c10::str(size - kObjectHeaderBytes, " payload bytes arrived, its header says ", length,
                             length > size - kObjectHeaderBytes ? " (truncated)" : "")));
  const uint8_t* payload = data + kObjectHeaderBytes;
  DDP_CHECK(get_u64(data + 24) == checksum_of(payload, length),
            damaged(c10::str("its ", length, " payload bytes do not match their checksum")));
  return std::string(reinterpret_cast<const char*>(payload), length);
}

std::string encode_ivalue(const c10::IValue& value) {
  const std::vector<char> pickled = torch::jit::pickle_save(value);
  return frame_object(ObjectKind::kIValue, pickled.data(), pickled.size());
}

c10::IValue decode_ivalue(const uint8_t* data, size_t size, const std::string& who, const std::string& from) {
  const std::string payload = unframe_object(data, size, ObjectKind::kIValue, who, from);
  try {
    return torch::jit::pickle_load(std::vector<char>(payload.begin(), payload.end()));
  } catch (const std::exception& e) {
    DDP_CHECK(false, who, ": the object from ", from, " does not unpickle (", payload.size(),
              " bytes, checksum correct, so it was sent so): ", error_message(e));
  }
  return {};
}

} // namespace ddp::internal
