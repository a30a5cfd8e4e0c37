#pragma once

// The TCPStore wire protocol (private header): message layout, limits, and
// the encoder and decoder both sides use, defined in tcp_store_protocol.cpp.
// The protocol itself is described at the top of tcp_store.cpp.

#include <cstddef>
#include <cstdint>
#include <optional>
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
  /// hello only: the server refuses this client (its token is wrong or
  /// missing); the body is the message, and the server then closes the
  /// connection.
  kRefused = 3,
};

/// "DDPS": the first field of kHello.
constexpr uint32_t kMagic = 0x44445053;
/// Bumped on any incompatible change. 2: hello carries a token, and its
/// reply the server's idle timeout.
constexpr uint32_t kProtocolVersion = 2;
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
/// Longest token in a hello.
constexpr uint32_t kMaxTokenBytes = 256;
/// The largest hello, header included: all that a connection that has not
/// completed the handshake may send.
constexpr size_t kMaxHelloBytes = kHeaderBytes + 4 + 4 + 1 + 4 + kMaxTokenBytes;
/// The largest hello reply the server makes: the idle timeout, or a refusal
/// message of at most 60 bytes.
constexpr size_t kMaxHelloReplyBytes = kHeaderBytes + 64;

/// The largest body a request with `command` may have; 0 for an unknown
/// command (check `is_command` first).
uint32_t max_request_body(uint8_t command);
/// Whether `byte` is a Command.
bool is_command(uint8_t byte);
/// The command's name for messages ("set", "wait", ...).
const char* command_name(Command command);
/// The largest reply body a client accepts.
constexpr uint32_t kMaxReplyBody = 4 + kMaxValueBytes;
/// The largest request, header included (a compare_set of two values of the
/// largest size).
constexpr size_t kMaxRequestBytes =
    kHeaderBytes + (4 + size_t{kMaxKeyBytes}) + 2 * (4 + size_t{kMaxValueBytes});
/// The largest reply, header included (a get of the largest value).
constexpr size_t kMaxReplyBytes = kHeaderBytes + size_t{kMaxReplyBody};

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
  /// Starts a message whose first byte is `kind` (a Command or a Status),
  /// with room for a body of `body_bytes` (it grows beyond if need be): a
  /// message built with its exact size holds no more memory than that size.
  explicit Writer(uint8_t kind, size_t body_bytes = 0);
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

/// A run of bytes inside a message body, not copied.
/// Lifetime: points into the body, which must outlive it.
struct ByteView {
  const uint8_t* data = nullptr;
  size_t size = 0;
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
  /// Like bytes(), without copying.
  ByteView view(uint32_t max_size, const char* what);
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

// ---- The server's side of the protocol, without sockets ----------------------
// What the server checks, as pure functions, so that the fuzzer
// (tests/store/fuzz/) runs exactly the server's code.

/// Checks the first `size` bytes (1 to kHeaderBytes) of a request header on a
/// connection that has, or has not yet (`greeted`), completed the handshake.
/// Returns why the message is refused, or nullopt when it is acceptable so far:
/// called as each byte of the header arrives, it refuses a bad command byte
/// at once, and a bad length as soon as the header is whole. Before the
/// handshake only a hello is accepted, and only as long as kMaxHelloBytes.
std::optional<std::string> check_header(const uint8_t* header, size_t size, bool greeted);

/// One request, parsed: the fields its command has (see the table at the top
/// of tcp_store.cpp); the others stay empty.
/// Lifetime: the views point into the body given to parse_request.
struct Request {
  Command command = Command::kHello;
  /// hello.
  uint8_t flags = 0;
  std::string token;
  /// set, get, add, compare_set, delete_key.
  std::string key;
  /// set: the value; compare_set: the desired value.
  ByteView value;
  /// compare_set.
  ByteView expected;
  /// get, wait: the timeout in ms, in [0, kMaxTimeoutMs]; add: the delta.
  int64_t number = 0;
  /// check, wait.
  std::vector<std::string> keys;
};

/// Parses the body of a request whose header check_header accepted. Throws
/// ProtocolError when a field is longer than its limit or than the body, when
/// bytes are left over, when a timeout is negative, and when a hello has the
/// wrong magic or version (checked before the fields that follow them, so
/// that a hello of another version is refused as such, not as malformed).
Request parse_request(Command command, const uint8_t* body, size_t size);

/// The token a TCPStore or TCPStoreServer uses: `option` when set, else
/// DDP_STORE_TOKEN, else none (empty). Throws c10::Error when it is longer
/// than kMaxTokenBytes.
std::string store_token(const std::optional<std::string>& option);

/// Whether `given` equals `expected`, in a time that depends only on the
/// length of `expected`, so that timing the refusals does not reveal the
/// token byte by byte.
bool token_matches(const std::string& expected, const std::string& given);

} // namespace ddp::internal::tcp_store
