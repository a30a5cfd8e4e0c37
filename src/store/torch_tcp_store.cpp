// TorchTCPStore: a client of PyTorch's TCPStore server.
//
// How it works
// ------------
// PyTorch's server (torch.distributed.TCPStore with is_master=True, in C++
// c10d's TCPStoreBackend.cpp, the "classic" server, or
// TCPStoreLibUvBackend.cpp, the libuv server that 2.x starts by default)
// keeps a map of byte strings on one thread and serves each connection one
// request at a time, in order. A *request* is a one-byte query code followed
// by its arguments; a *reply* has no header: its shape follows from the
// query, and some queries have none. Integers go in the host's byte order,
// since PyTorch copies them from memory; every platform PyTorch runs on is
// little-endian, so this client writes and reads little-endian.
//
//   string    u64 length, then that many bytes (keys and values alike)
//   key list  u64 count, then that many strings
//
//   query        code: unvalidated  validated  arguments          reply
//   validate                     -          0  u32 0x3C85F7CE     none
//   set                          0          1  key, value         none
//   compare_set                  1          2  key, expected,     string
//                                              desired
//   get                          2          3  key                string
//   add                          3          4  key, i64 delta     i64 new value
//   check                        4          5  key list           u8 0 all exist,
//                                                                 1 not
//   wait                         5          6  key list           u8 0 once all
//                                                                 exist
//   num_keys                     6          7  (none)             i64 count
//   delete_key                   8          8  key                i64 number
//                                                                 deleted
//   ping                         -         13  u32 nonce          u32 the nonce
//
// The two numberings are TorchStoreProtocol's two values. In the validated
// one (later 2.x releases), the first request on every connection must be
// validate, or the server drops the connection (the classic server) or
// ignores it (libuv). PyTorch's own client also puts "/" in front of every
// key; this client does the same, so that both see the same keys.
//
// A server drops the connection, and says nothing, on any request it cannot
// serve: a get of a missing key (the classic server; libuv answers an empty
// string), an add to a value that is not a number, a key over 8 KiB or a
// value over 8 MiB (libuv). So, as PyTorch's client does, get waits for its
// key before it asks for it; the limits are checked here, as misuse; and a
// dropped add is looked into (see TorchTCPStore::add).
//
// The server has no deadlines: a wait stays registered until its keys exist
// or its connection closes. This client keeps every deadline itself, polling
// its socket (store/socket.h), and ends a wait that timed out by closing the
// connection, which every server takes as the end of the wait. Each call
// takes a connection from a pool and gives it back when the exchange is
// complete; a connection that saw a timeout or an error is closed instead,
// so that a late reply can never be read as the answer to the next request.
// A call that finds the pool empty opens a new connection.
//
// Note [Protocol probe]
// Neither numbering says which it is, and a wrong guess is not harmless: an
// unvalidated server reads a validate message as a set, whose key length is
// made of the magic number and the next four bytes, and allocates that many
// bytes. So the first connection sends
//
//   validate 0x3C85F7CE, then ping with the nonce 0x7AFFFFFF
//
// A validated server with ping answers the nonce: kValidated. An unvalidated
// server reads a key length whose high four bytes are the ping code and the
// nonce's low three bytes, 0xFFFFFF0D3C85F7CE: larger than any std::vector,
// so its allocation throws at once and it drops the connection, its state
// unchanged. A validated server without ping (the first validated releases)
// drops it too. The second connection then sends num_keys in the unvalidated
// numbering (code 6): an unvalidated server answers 8 bytes (kUnvalidated);
// a validated one drops the connection (classic) or says nothing (libuv),
// since the message is not validate: kValidated after kProbeSilence.

#include <ddp/store/torch_tcp_store.h>

#include <ddp/comm/error.h>

#include "store/socket.h"
#include "store/store_util.h"
#include "internal/check.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

namespace ddp {
namespace internal {

namespace {

using std::chrono::milliseconds;

constexpr uint32_t kValidateMagic = 0x3C85F7CE;
// The ping nonce of the probe: its low three bytes must stay 0xFF. See Note
// [Protocol probe].
constexpr uint32_t kProbeNonce = 0x7AFFFFFF;
// The libuv server's limits (MAX_STRING_LEN, MAX_PAYLOAD_LEN, MAX_KEY_COUNT);
// the key limit counts the "/" in front.
constexpr size_t kMaxKeyBytes = 8191;
constexpr size_t kMaxValueBytes = size_t{8} << 20;
constexpr size_t kMaxKeysPerCall = size_t{128} << 10;
// A classic server holds values of any size (set by Python clients); replies
// larger than this are taken for garbage rather than allocated.
constexpr uint64_t kMaxReplyValueBytes = uint64_t{64} << 20;
constexpr char kKeyPrefix = '/';
// How long the second probe waits for an unvalidated server's answer before
// it takes the silence for a validated (libuv) server.
constexpr milliseconds kProbeSilence{2000};
constexpr milliseconds kFirstBackoff{10};
constexpr milliseconds kMaxBackoff{1000};
// Idle connections a client keeps for reuse; more are closed.
constexpr size_t kMaxIdleConnections = 8;

enum class Query {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kDeleteKey,
  kPing,
};

uint8_t query_code(TorchStoreProtocol protocol, Query query) {
  const bool validated = protocol == TorchStoreProtocol::kValidated;
  switch (query) {
    case Query::kValidate:
      DDP_INTERNAL_ASSERT(validated, "validate in the unvalidated protocol");
      return 0;
    case Query::kSet:
      return validated ? 1 : 0;
    case Query::kCompareSet:
      return validated ? 2 : 1;
    case Query::kGet:
      return validated ? 3 : 2;
    case Query::kAdd:
      return validated ? 4 : 3;
    case Query::kCheck:
      return validated ? 5 : 4;
    case Query::kWait:
      return validated ? 6 : 5;
    case Query::kNumKeys:
      return validated ? 7 : 6;
    case Query::kDeleteKey:
      return 8;
    case Query::kPing:
      DDP_INTERNAL_ASSERT(validated, "ping in the unvalidated protocol");
      return 13;
  }
  DDP_INTERNAL_ASSERT(false, "unknown query");
  return 0;
}

uint32_t load_u32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

uint64_t load_u64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | p[i];
  }
  return value;
}

// The bytes of one or more requests, sent together.
class Request {
 public:
  Request(TorchStoreProtocol protocol, Query query) : protocol_(protocol) {
    then(query);
  }

  // Starts another request behind the ones before.
  void then(Query query) {
    data_.push_back(query_code(protocol_, query));
  }

  void u32(uint32_t value) {
    for (int shift = 0; shift < 32; shift += 8) {
      data_.push_back(static_cast<uint8_t>(value >> shift));
    }
  }

  void u64(uint64_t value) {
    for (int shift = 0; shift < 64; shift += 8) {
      data_.push_back(static_cast<uint8_t>(value >> shift));
    }
  }

  void i64(int64_t value) {
    u64(static_cast<uint64_t>(value));
  }

  void value(const std::vector<uint8_t>& bytes) {
    u64(bytes.size());
    data_.insert(data_.end(), bytes.begin(), bytes.end());
  }

  void key(const std::string& key) {
    u64(key.size() + 1);
    data_.push_back(static_cast<uint8_t>(kKeyPrefix));
    data_.insert(data_.end(), key.begin(), key.end());
  }

  void keys(const std::vector<std::string>& keys) {
    u64(keys.size());
    for (const auto& k : keys) {
      key(k);
    }
  }

  const std::vector<uint8_t>& data() const {
    return data_;
  }

 private:
  TorchStoreProtocol protocol_;
  std::vector<uint8_t> data_;
};

} // namespace

// What a call is about, for its error messages.
struct TorchStoreOp {
  const char* name;
  // "key 'k'", "keys [a, b]" or empty.
  std::string subject;
  // The deadline the call was given, for "did not answer within".
  milliseconds timeout;
};

// The client side of one TorchTCPStore: the protocol found by the probe and a
// pool of connections to the server.
// Thread-safety: safe to call from many threads; each call uses a connection
// of its own.
class TorchTCPStoreClient {
 public:
  // One connection, taken from the pool for one call. finish() gives it
  // back; a lease destroyed unfinished closes its connection, so that a
  // half-done exchange (a timeout, an error, a wait the server still holds)
  // is never reused.
  class Lease {
   public:
    // `client` is not owned: it is the store's, which outlives its calls.
    Lease(TorchTCPStoreClient* client, Socket socket, const TorchStoreOp* op)
        : client_(client), socket_(std::move(socket)), op_(op) {}

    void send(const Request& request, SteadyClock::time_point deadline) {
      const auto& data = request.data();
      IoResult sent = send_all(socket_.fd(), data.data(), data.size(), deadline);
      if (sent.status != IoStatus::kOk) {
        client_->fail(*op_, sent);
      }
    }

    // Receives exactly `size` bytes; the outcome is the caller's to judge.
    IoResult try_recv(uint8_t* data, size_t size, SteadyClock::time_point deadline) {
      return recv_all(socket_.fd(), data, size, deadline);
    }

    void recv(uint8_t* data, size_t size, SteadyClock::time_point deadline) {
      IoResult got = try_recv(data, size, deadline);
      if (got.status != IoStatus::kOk) {
        client_->fail(*op_, got);
      }
    }

    uint8_t u8(SteadyClock::time_point deadline) {
      uint8_t value = 0;
      recv(&value, 1, deadline);
      return value;
    }

    int64_t i64(SteadyClock::time_point deadline) {
      uint8_t bytes[8];
      recv(bytes, sizeof(bytes), deadline);
      return static_cast<int64_t>(load_u64(bytes));
    }

    std::vector<uint8_t> value(SteadyClock::time_point deadline) {
      uint8_t size_bytes[8];
      recv(size_bytes, sizeof(size_bytes), deadline);
      const uint64_t size = load_u64(size_bytes);
      if (size > kMaxReplyValueBytes) {
        throw client_->malformed(
            *op_,
            "a value of " + std::to_string(size) + " bytes, over the limit of " +
                std::to_string(kMaxReplyValueBytes));
      }
      std::vector<uint8_t> value(size);
      recv(value.data(), value.size(), deadline);
      return value;
    }

    // The exchange is complete: the connection goes back to the pool.
    void finish() {
      client_->release(std::move(socket_));
    }

    // The exchange is abandoned: the connection is closed now.
    void drop() {
      socket_.reset();
    }

   private:
    TorchTCPStoreClient* client_;
    Socket socket_;
    const TorchStoreOp* op_; // The caller's, alive for the whole call.
  };

  TorchTCPStoreClient(std::string host, int port)
      : host_(std::move(host)), port_(port), address_(host_port(host_, port)) {}

  // Opens the first connection, retrying until `timeout`, and finds out the
  // protocol. See Note [Protocol probe].
  void connect(milliseconds timeout) {
    const TorchStoreOp op{"connect", "", timeout};
    const auto deadline = deadline_after(timeout);
    {
      Socket socket = open_socket(op, deadline);
      Request probe(TorchStoreProtocol::kValidated, Query::kValidate);
      probe.u32(kValidateMagic);
      probe.then(Query::kPing);
      probe.u32(kProbeNonce);
      IoResult result =
          send_all(socket.fd(), probe.data().data(), probe.data().size(), deadline);
      uint8_t echo[4] = {};
      if (result.status == IoStatus::kOk) {
        result = recv_all(socket.fd(), echo, sizeof(echo), deadline);
      }
      if (result.status == IoStatus::kOk) {
        if (load_u32(echo) != kProbeNonce) {
          throw IoError(
              prefix(op) + "the server at " + address_ +
              " answered the handshake unlike a PyTorch TCPStore server (a ping of " +
              std::to_string(kProbeNonce) + " came back as " + std::to_string(load_u32(echo)) +
              ")");
        }
        protocol_ = TorchStoreProtocol::kValidated;
        release(std::move(socket));
        return;
      }
      if (result.status == IoStatus::kTimedOut) {
        throw TimeoutError(
            prefix(op) + "timed out after " + std::to_string(timeout.count()) +
            " ms waiting for the server at " + address_ +
            " to answer the handshake; is a PyTorch TCPStore server listening there?");
      }
      // Dropped: an unvalidated server, or a validated one without ping.
    }
    Socket socket = open_socket(op, deadline);
    Request count(TorchStoreProtocol::kUnvalidated, Query::kNumKeys);
    IoResult result =
        send_all(socket.fd(), count.data().data(), count.data().size(), deadline);
    uint8_t reply[8];
    if (result.status == IoStatus::kOk) {
      result = recv_all(
          socket.fd(), reply, sizeof(reply),
          std::min(deadline, SteadyClock::now() + kProbeSilence));
    }
    if (result.status == IoStatus::kOk) {
      protocol_ = TorchStoreProtocol::kUnvalidated;
      release(std::move(socket));
      return;
    }
    if (result.status == IoStatus::kTimedOut && SteadyClock::now() >= deadline) {
      throw TimeoutError(
          prefix(op) + "timed out after " + std::to_string(timeout.count()) +
          " ms waiting for the server at " + address_ +
          " to answer the handshake; is a PyTorch TCPStore server listening there?");
    }
    protocol_ = TorchStoreProtocol::kValidated;
  }

  TorchStoreProtocol protocol() const {
    return protocol_;
  }

  const std::string& address() const {
    return address_;
  }

  // A connection for `op`: an idle one, or a new one opened by `deadline`.
  Lease acquire(const TorchStoreOp& op, SteadyClock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        Socket socket = std::move(idle_.back());
        idle_.pop_back();
        return Lease(this, std::move(socket), &op);
      }
    }
    Lease lease(this, open_socket(op, deadline), &op);
    if (protocol_ == TorchStoreProtocol::kValidated) {
      Request validate(protocol_, Query::kValidate);
      validate.u32(kValidateMagic);
      lease.send(validate, deadline);
    }
    return lease;
  }

  // "TorchTCPStore get: key 'k': ".
  static std::string prefix(const TorchStoreOp& op) {
    std::string text = std::string("TorchTCPStore ") + op.name + ": ";
    if (!op.subject.empty()) {
      text += op.subject + ": ";
    }
    return text;
  }

  IoError malformed(const TorchStoreOp& op, const std::string& what) const {
    return IoError(
        prefix(op) + "malformed reply from the store server at " + address_ + ": " + what);
  }

  [[noreturn]] void fail(const TorchStoreOp& op, const IoResult& result) const {
    if (result.status == IoStatus::kTimedOut) {
      throw TimeoutError(
          prefix(op) + "the store server at " + address_ + " did not answer within " +
          std::to_string(op.timeout.count()) + " ms");
    }
    throw IoError(
        prefix(op) + "lost the connection to the store server at " + address_ + " (" +
        describe(result) + ")");
  }

 private:
  void release(Socket socket) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < kMaxIdleConnections) {
      idle_.push_back(std::move(socket));
    }
  }

  Socket open_socket(const TorchStoreOp& op, SteadyClock::time_point deadline) {
    auto backoff = kFirstBackoff;
    while (true) {
      ConnectResult result = try_connect(host_, port_, deadline);
      if (result.socket.valid()) {
        connected_once_.store(true);
        return std::move(result.socket);
      }
      if (result.refused && connected_once_.load()) {
        // It was up and now nothing listens: it is gone, not late.
        throw IoError(
            prefix(op) + "the store server at " + address_ +
            " refused a new connection; it has stopped (" + result.error + ")");
      }
      const auto now = SteadyClock::now();
      if (now >= deadline) {
        throw TimeoutError(
            prefix(op) + "timed out after " + std::to_string(op.timeout.count()) +
            " ms connecting to the store server at " + address_ + " (last error: " +
            result.error + ")");
      }
      std::this_thread::sleep_for(std::min<SteadyClock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  const std::string host_;
  const int port_;
  const std::string address_;
  // Written once by connect(), before the store is shared.
  TorchStoreProtocol protocol_ = TorchStoreProtocol::kValidated;
  std::atomic<bool> connected_once_{false};
  std::mutex mutex_;
  std::vector<Socket> idle_; // Guarded by mutex_.
};

} // namespace internal

// ---- TorchTCPStore -------------------------------------------------------------

namespace {

using internal::Query;
using internal::Request;
using internal::SteadyClock;
using internal::TorchStoreOp;
using std::chrono::milliseconds;

std::string key_subject(const std::string& key) {
  return "key '" + key + "'";
}

std::string keys_subject(const std::vector<std::string>& keys) {
  return keys.size() == 1 ? key_subject(keys[0]) : "keys " + internal::format_keys(keys);
}

void check_key(const char* op, const std::string& key) {
  DDP_CHECK(
      key.size() <= internal::kMaxKeyBytes, "TorchTCPStore ", op, ": the key is ", key.size(),
      " bytes, over the limit of ", internal::kMaxKeyBytes,
      " (PyTorch's libuv server refuses longer keys)");
}

void check_value(const char* op, const char* what, const std::vector<uint8_t>& value) {
  DDP_CHECK(
      value.size() <= internal::kMaxValueBytes, "TorchTCPStore ", op, ": the ", what, " is ",
      value.size(), " bytes, over the limit of ", internal::kMaxValueBytes,
      " (PyTorch's libuv server refuses larger values)");
}

void check_keys(const char* op, const std::vector<std::string>& keys) {
  DDP_CHECK(
      keys.size() <= internal::kMaxKeysPerCall, "TorchTCPStore ", op, ": ", keys.size(),
      " keys, over the limit of ", internal::kMaxKeysPerCall, " per call");
  for (const auto& key : keys) {
    check_key(op, key);
  }
}

// Whether PyTorch's server can read `value` as a counter: it calls
// std::stoll, which skips leading white space, takes a sign, needs one digit
// at least, ignores what follows, and fails on overflow.
bool torch_reads_as_counter(const std::vector<uint8_t>& value) {
  const std::string text(value.begin(), value.end());
  char* end = nullptr;
  errno = 0;
  std::strtoll(text.c_str(), &end, 10);
  return end != text.c_str() && errno != ERANGE;
}

} // namespace

TorchTCPStore::TorchTCPStore(std::string host, TorchTCPStoreOptions options)
    : Store(options.timeout()), host_(std::move(host)), port_(options.port()) {
  DDP_CHECK(!host_.empty(), "TorchTCPStore: the host is empty");
  DDP_CHECK(
      port_ >= 1 && port_ <= 65535, "TorchTCPStore: port must be in [1, 65535] (got ", port_,
      "); this is a client and needs the server's real port");
  client_ = std::make_unique<internal::TorchTCPStoreClient>(host_, port_);
  client_->connect(timeout());
}

TorchTCPStore::~TorchTCPStore() = default;

const std::string& TorchTCPStore::host() const {
  return host_;
}

int TorchTCPStore::port() const {
  return port_;
}

TorchStoreProtocol TorchTCPStore::protocol() const {
  return client_->protocol();
}

void TorchTCPStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  check_key("set", key);
  check_value("set", "value", value);
  const TorchStoreOp op{"set", key_subject(key), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kSet);
  request.key(key);
  request.value(value);
  // set has no reply; the key count behind it has, once the set is applied.
  request.then(Query::kNumKeys);
  lease.send(request, deadline);
  lease.i64(deadline);
  lease.finish();
}

std::vector<uint8_t> TorchTCPStore::get(const std::string& key) {
  check_key("get", key);
  wait_for("get", {key}, timeout());
  const TorchStoreOp op{"get", key_subject(key), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kGet);
  request.key(key);
  lease.send(request, deadline);
  auto value = lease.value(deadline);
  lease.finish();
  return value;
}

int64_t TorchTCPStore::add(const std::string& key, int64_t delta) {
  check_key("add", key);
  const TorchStoreOp op{"add", key_subject(key), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kAdd);
  request.key(key);
  request.i64(delta);
  lease.send(request, deadline);
  int64_t sum = 0;
  try {
    sum = lease.i64(deadline);
  } catch (const IoError&) {
    // The server drops the connection when the old value is not a number;
    // if that is why, say so (misuse), else the IoError stands.
    std::optional<std::vector<uint8_t>> old_value;
    try {
      if (check({key})) {
        old_value = read_now(key);
      }
    } catch (const CommError&) {
    }
    DDP_CHECK(
        !old_value.has_value() || torch_reads_as_counter(*old_value), "TorchTCPStore add: ",
        key_subject(key), ": the value is not a number (got ", internal::quote_value(*old_value),
        "), and PyTorch's server at ", client_->address(),
        " dropped the connection rather than add to it");
    throw;
  }
  lease.finish();
  return sum;
}

std::vector<uint8_t> TorchTCPStore::compare_set(
    const std::string& key,
    const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  check_key("compare_set", key);
  check_value("compare_set", "expected value", expected);
  check_value("compare_set", "desired value", desired);
  const TorchStoreOp op{"compare_set", key_subject(key), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kCompareSet);
  request.key(key);
  request.value(expected);
  request.value(desired);
  lease.send(request, deadline);
  auto value = lease.value(deadline);
  lease.finish();
  return value;
}

bool TorchTCPStore::check(const std::vector<std::string>& keys) {
  check_keys("check", keys);
  if (keys.empty()) {
    return true;
  }
  const TorchStoreOp op{"check", keys_subject(keys), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kCheck);
  request.keys(keys);
  lease.send(request, deadline);
  const uint8_t reply = lease.u8(deadline);
  if (reply > 1) {
    throw client_->malformed(op, "check answered " + std::to_string(reply) + ", expected 0 or 1");
  }
  lease.finish();
  return reply == 0;
}

void TorchTCPStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  check_keys("wait", keys);
  DDP_CHECK(
      timeout.count() >= 0, "TorchTCPStore wait: timeout must not be negative (got ",
      timeout.count(), " ms)");
  wait_for("wait", keys, timeout);
}

bool TorchTCPStore::delete_key(const std::string& key) {
  check_key("delete_key", key);
  const TorchStoreOp op{"delete_key", key_subject(key), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kDeleteKey);
  request.key(key);
  lease.send(request, deadline);
  const int64_t deleted = lease.i64(deadline);
  if (deleted != 0 && deleted != 1) {
    throw client_->malformed(
        op, "delete_key answered " + std::to_string(deleted) + " keys deleted, expected 0 or 1");
  }
  lease.finish();
  return deleted == 1;
}

int64_t TorchTCPStore::num_keys() {
  const TorchStoreOp op{"num_keys", "", timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  lease.send(Request(client_->protocol(), Query::kNumKeys), deadline);
  const int64_t count = lease.i64(deadline);
  if (count < 0) {
    throw client_->malformed(op, "a key count of " + std::to_string(count));
  }
  lease.finish();
  return count;
}

void TorchTCPStore::wait_for(
    const char* name,
    const std::vector<std::string>& keys,
    milliseconds timeout) {
  if (keys.empty()) {
    return;
  }
  // The connection is opened within the store's timeout; the wait itself
  // gets `timeout`.
  const TorchStoreOp op{name, keys_subject(keys), this->timeout()};
  auto lease = client_->acquire(op, internal::deadline_after(op.timeout));
  const auto deadline = internal::deadline_after(timeout);
  Request request(client_->protocol(), Query::kWait);
  request.keys(keys);
  lease.send(request, internal::deadline_after(op.timeout));
  uint8_t reply = 0;
  const internal::IoResult got = lease.try_recv(&reply, 1, deadline);
  if (got.status == internal::IoStatus::kTimedOut) {
    // Closing the connection ends the server's wait.
    lease.drop();
    std::vector<std::string> missing;
    try {
      for (const auto& key : keys) {
        if (!check({key})) {
          missing.push_back(key);
        }
      }
    } catch (const CommError&) {
      missing = keys;
    }
    if (missing.empty()) {
      // They all came in just after the deadline: the wait is over.
      return;
    }
    throw TimeoutError(
        std::string("TorchTCPStore ") + name + ": " +
        internal::timed_out_message(timeout, missing) + " at " + client_->address());
  }
  if (got.status != internal::IoStatus::kOk) {
    client_->fail(op, got);
  }
  if (reply != 0) {
    throw client_->malformed(op, "wait answered " + std::to_string(reply) + ", expected 0");
  }
  lease.finish();
}

std::vector<uint8_t> TorchTCPStore::read_now(const std::string& key) {
  const TorchStoreOp op{"get", key_subject(key), timeout()};
  const auto deadline = internal::deadline_after(op.timeout);
  auto lease = client_->acquire(op, deadline);
  Request request(client_->protocol(), Query::kGet);
  request.key(key);
  lease.send(request, deadline);
  auto value = lease.value(deadline);
  lease.finish();
  return value;
}

} // namespace ddp
