// The TCPStore wire protocol, both sides of it: the encoder (Writer) and
// decoder (Reader), each command's largest body, and the server's checks of
// what a client sends (check_header, parse_request, token_matches), pure
// functions that the fuzzer in tests/store/fuzz/ calls too. The protocol, its
// message table and its limits are described in the "How it works"
// narrative at the top of tcp_store.cpp, whose terms are used here.

#include "store/tcp_store_protocol.h"

#include "internal/check.h"
#include "internal/env.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace ddp::internal::tcp_store {

uint32_t max_request_body(uint8_t command) {
  constexpr uint64_t kKey = 4 + uint64_t{kMaxKeyBytes};
  constexpr uint64_t kValue = 4 + uint64_t{kMaxValueBytes};
  uint64_t limit = 0;
  switch (static_cast<Command>(command)) {
    case Command::kHello:
      limit = kMaxHelloBytes - kHeaderBytes;
      break;
    case Command::kSet:
      limit = kKey + kValue;
      break;
    case Command::kGet:
    case Command::kAdd:
      limit = kKey + 8;
      break;
    case Command::kCompareSet:
      limit = kKey + 2 * kValue;
      break;
    case Command::kCheck:
      limit = kMaxKeyListBytes;
      break;
    case Command::kWait:
      limit = 8 + uint64_t{kMaxKeyListBytes};
      break;
    case Command::kDeleteKey:
      limit = kKey;
      break;
    case Command::kNumKeys:
      limit = 0;
      break;
  }
  return static_cast<uint32_t>(limit);
}

bool is_command(uint8_t byte) {
  return byte >= static_cast<uint8_t>(Command::kHello) &&
      byte <= static_cast<uint8_t>(Command::kNumKeys);
}

const char* command_name(Command command) {
  switch (command) {
    case Command::kHello:
      return "hello";
    case Command::kSet:
      return "set";
    case Command::kGet:
      return "get";
    case Command::kAdd:
      return "add";
    case Command::kCompareSet:
      return "compare_set";
    case Command::kCheck:
      return "check";
    case Command::kWait:
      return "wait";
    case Command::kDeleteKey:
      return "delete_key";
    case Command::kNumKeys:
      return "num_keys";
  }
  return "unknown";
}

uint32_t body_length(const uint8_t* header) {
  return (uint32_t{header[1]} << 24) | (uint32_t{header[2]} << 16) |
      (uint32_t{header[3]} << 8) | uint32_t{header[4]};
}

Writer::Writer(uint8_t kind, size_t body_bytes) {
  buffer_.reserve(kHeaderBytes + body_bytes);
  buffer_.assign({kind, 0, 0, 0, 0});
}

void Writer::u8(uint8_t value) {
  buffer_.push_back(value);
}

void Writer::u32(uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    buffer_.push_back(static_cast<uint8_t>(value >> shift));
  }
}

void Writer::i64(int64_t value) {
  const auto bits = static_cast<uint64_t>(value);
  for (int shift = 56; shift >= 0; shift -= 8) {
    buffer_.push_back(static_cast<uint8_t>(bits >> shift));
  }
}

void Writer::bytes(const void* data, size_t size) {
  DDP_INTERNAL_ASSERT(size <= UINT32_MAX, "field of ", size, " bytes");
  u32(static_cast<uint32_t>(size));
  const auto* p = static_cast<const uint8_t*>(data);
  buffer_.insert(buffer_.end(), p, p + size);
}

void Writer::keys(const std::vector<std::string>& keys) {
  u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    bytes(key);
  }
}

std::vector<uint8_t> Writer::finish() && {
  const size_t body = buffer_.size() - kHeaderBytes;
  DDP_INTERNAL_ASSERT(body <= UINT32_MAX, "message body of ", body, " bytes");
  for (int i = 0; i < 4; ++i) {
    buffer_[1 + i] = static_cast<uint8_t>(body >> (24 - 8 * i));
  }
  return std::move(buffer_);
}

const uint8_t* Reader::take(size_t n, const char* what) {
  if (size_ - pos_ < n) {
    throw ProtocolError(
        std::string(what) + " needs " + std::to_string(n) + " bytes but the body has " +
        std::to_string(size_ - pos_) + " left");
  }
  const uint8_t* p = data_ + pos_;
  pos_ += n;
  return p;
}

uint8_t Reader::u8() {
  return *take(1, "a u8 field");
}

uint32_t Reader::u32() {
  const uint8_t* p = take(4, "a u32 field");
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

int64_t Reader::i64() {
  const uint8_t* p = take(8, "an i64 field");
  uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) {
    bits = (bits << 8) | p[i];
  }
  return static_cast<int64_t>(bits);
}

std::string Reader::string(uint32_t max_size, const char* what) {
  const uint32_t size = u32();
  if (size > max_size) {
    throw ProtocolError(
        std::string(what) + " of " + std::to_string(size) + " bytes is over the limit of " +
        std::to_string(max_size));
  }
  const uint8_t* p = take(size, what);
  return std::string(reinterpret_cast<const char*>(p), size);
}

std::vector<uint8_t> Reader::bytes(uint32_t max_size, const char* what) {
  const uint32_t size = u32();
  if (size > max_size) {
    throw ProtocolError(
        std::string(what) + " of " + std::to_string(size) + " bytes is over the limit of " +
        std::to_string(max_size));
  }
  const uint8_t* p = take(size, what);
  return std::vector<uint8_t>(p, p + size);
}

ByteView Reader::view(uint32_t max_size, const char* what) {
  const uint32_t size = u32();
  if (size > max_size) {
    throw ProtocolError(
        std::string(what) + " of " + std::to_string(size) + " bytes is over the limit of " +
        std::to_string(max_size));
  }
  return ByteView{take(size, what), size};
}

std::vector<std::string> Reader::keys() {
  const uint32_t count = u32();
  if (count > kMaxKeysPerRequest) {
    throw ProtocolError(
        "a list of " + std::to_string(count) + " keys is over the limit of " +
        std::to_string(kMaxKeysPerRequest));
  }
  std::vector<std::string> keys;
  // Each key takes 4 bytes at least: never reserve more than the body holds.
  keys.reserve(std::min<size_t>(count, (size_ - pos_) / 4));
  for (uint32_t i = 0; i < count; ++i) {
    keys.push_back(string(kMaxKeyBytes, "key"));
  }
  return keys;
}

void Reader::finish() const {
  if (pos_ != size_) {
    throw ProtocolError(std::to_string(size_ - pos_) + " bytes left over at the end of the body");
  }
}

std::optional<std::string> check_header(const uint8_t* header, size_t size, bool greeted) {
  if (size == 0) {
    return std::nullopt;
  }
  if (!is_command(header[0])) {
    return "unknown command byte " + std::to_string(header[0]);
  }
  const auto command = static_cast<Command>(header[0]);
  if (!greeted && command != Command::kHello) {
    // Refused on its first byte: nothing but a hello is ever buffered for a
    // connection that has not completed the handshake.
    return std::string("the first request of a connection must be a hello (got a ") +
        command_name(command) + " command byte)";
  }
  if (size < kHeaderBytes) {
    return std::nullopt;
  }
  const uint32_t length = body_length(header);
  const uint32_t limit = max_request_body(header[0]);
  if (length > limit) {
    return std::string("the length prefix of a ") + command_name(command) + " request is " +
        std::to_string(length) + " bytes, over the limit of " + std::to_string(limit);
  }
  return std::nullopt;
}

Request parse_request(Command command, const uint8_t* body, size_t size) {
  Reader r(body, size);
  Request request;
  request.command = command;
  const auto timeout = [&] {
    const int64_t ms = r.i64();
    if (ms < 0) {
      throw ProtocolError("negative timeout " + std::to_string(ms));
    }
    return std::min(ms, kMaxTimeoutMs);
  };
  switch (command) {
    case Command::kHello: {
      if (r.u32() != kMagic) {
        throw ProtocolError("not a ddp TCPStore client (bad magic)");
      }
      const uint32_t version = r.u32();
      if (version != kProtocolVersion) {
        throw ProtocolError(
            "protocol version " + std::to_string(version) + ", this server speaks " +
            std::to_string(kProtocolVersion));
      }
      request.flags = r.u8();
      request.token = r.string(kMaxTokenBytes, "token");
      break;
    }
    case Command::kSet:
      request.key = r.string(kMaxKeyBytes, "key");
      request.value = r.view(kMaxValueBytes, "value");
      break;
    case Command::kGet:
      request.key = r.string(kMaxKeyBytes, "key");
      request.number = timeout();
      break;
    case Command::kAdd:
      request.key = r.string(kMaxKeyBytes, "key");
      request.number = r.i64();
      break;
    case Command::kCompareSet:
      request.key = r.string(kMaxKeyBytes, "key");
      request.expected = r.view(kMaxValueBytes, "expected value");
      request.value = r.view(kMaxValueBytes, "desired value");
      break;
    case Command::kCheck:
      request.keys = r.keys();
      break;
    case Command::kWait:
      request.number = timeout();
      request.keys = r.keys();
      break;
    case Command::kDeleteKey:
      request.key = r.string(kMaxKeyBytes, "key");
      break;
    case Command::kNumKeys:
      break;
    default:
      throw ProtocolError("unknown command " + std::to_string(static_cast<int>(command)));
  }
  r.finish();
  return request;
}

bool token_matches(const std::string& expected, const std::string& given) {
  // Every byte of `expected` is looked at whatever `given` holds; a length
  // mismatch is folded into the same accumulator rather than returned early.
  // volatile keeps the compiler from turning the loop into an early-exit
  // memcmp.
  volatile uint8_t difference = expected.size() == given.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const uint8_t other = i < given.size() ? static_cast<uint8_t>(given[i]) : 0;
    difference = difference | (static_cast<uint8_t>(expected[i]) ^ other);
  }
  return difference == 0;
}

std::string store_token(const std::optional<std::string>& option) {
  std::string token = option.has_value() ? *option : env_get(kEnvStoreToken).value_or("");
  DDP_CHECK(
      token.size() <= kMaxTokenBytes, "TCPStore: the token",
      option.has_value() ? "" : " (from DDP_STORE_TOKEN)", " is ", token.size(),
      " bytes, over the limit of ", kMaxTokenBytes);
  return token;
}

} // namespace ddp::internal::tcp_store
