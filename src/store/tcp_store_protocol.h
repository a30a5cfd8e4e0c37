#pragma once

// The TCPStore wire protocol (private header): message layout, limits, and
// the encoder and decoder both sides use. The protocol itself is described at
// the top of tcp_store.cpp.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::internal::tcp_store {

/// First byte of a request.
enum class Command : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kCheck = 6,
  kWait = 7,
  kDeleteKey = 8,
  kNumKeys = 9,
};

/// First byte of a reply.
enum class Status : uint8_t {
  kOk = 0,
  /// get/wait: the keys were still missing at the deadline.
  kTimedOut = 1,
  /// The request was well formed but cannot be done (e.g. add to a key whose
  /// value is not a number); the body is the message.
  kBadRequest = 2,
};

/// "DDPS": the first field of kHello.
constexpr uint32_t kMagic = 0x44445053;
/// Bumped on any incompatible change.
constexpr uint32_t kProtocolVersion = 1;
/// kHello flag: count this connection as a worker (see
/// TCPStoreServer::wait_for_workers); set on the first connection of each
/// TCPStore object only.
constexpr uint8_t kHelloWorkerFlag = 1;

/// u8 command or status, then u32 body length.
constexpr size_t kHeaderBytes = 5;
/// Longest key.
constexpr uint32_t kMaxKeyBytes = 64 * 1024;
/// Longest value.
constexpr uint32_t kMaxValueBytes = 64 * 1024 * 1024;
/// Most keys in one check or wait.
constexpr uint32_t kMaxKeysPerRequest = 64 * 1024;
/// Longest encoded key list (count and keys) in one message.
constexpr uint32_t kMaxKeyListBytes = 16 * 1024 * 1024;
/// Longest get/wait timeout a request may carry: 30 days (keeps deadline
/// arithmetic far from overflow).
constexpr int64_t kMaxTimeoutMs = 30LL * 24 * 3600 * 1000;

/// The largest body a request with `command` may have; 0 for an unknown
/// command (check `is_command` first).
uint32_t max_request_body(uint8_t command);
/// Whether `byte` is a Command.
bool is_command(uint8_t byte);
/// The command's name for messages ("set", "wait", ...).
const char* command_name(Command command);
/// The largest reply body a client accepts.
constexpr uint32_t kMaxReplyBody = 4 + kMaxValueBytes;

/// A message that breaks the protocol: bad length, bad field, trailing bytes.
/// Thread-safety: immutable once thrown.
class ProtocolError : public std::runtime_error {
 public:
  explicit ProtocolError(const std::string& message) : std::runtime_error(message) {}
};

/// Builds one message: header, then fields, big-endian. `finish()` writes the
/// body length into the header.
/// Thread-safety: none; one thread builds a message.
class Writer {
 public:
  /// Starts a message whose first byte is `kind` (a Command or a Status).
  explicit Writer(uint8_t kind);
  void u8(uint8_t value);
  void u32(uint32_t value);
  void i64(int64_t value);
  /// u32 length, then the bytes.
  void bytes(const void* data, size_t size);
  void bytes(const std::string& value) {
    bytes(value.data(), value.size());
  }
  void bytes(const std::vector<uint8_t>& value) {
    bytes(value.data(), value.size());
  }
  /// u32 count, then each key as bytes().
  void keys(const std::vector<std::string>& keys);
  /// The message, with its body length filled in.
  std::vector<uint8_t> finish() &&;

 private:
  std::vector<uint8_t> buffer_;
};

/// Reads the fields of one body, checking every length against what is
/// left and against its limit; throws ProtocolError on any violation.
/// Thread-safety: none. Lifetime: `data` must outlive the Reader.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  /// A u32-length-prefixed field of at most `max_size` bytes.
  std::string string(uint32_t max_size, const char* what);
  std::vector<uint8_t> bytes(uint32_t max_size, const char* what);
  /// A key list as written by Writer::keys.
  std::vector<std::string> keys();
  /// Throws unless the whole body was read.
  void finish() const;

 private:
  const uint8_t* take(size_t n, const char* what);

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// The body length in a header.
uint32_t body_length(const uint8_t* header);

} // namespace ddp::internal::tcp_store
