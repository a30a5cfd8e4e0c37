// The TCPStore server's buffer budget: what a request is charged at
// admission, the throttled queue of what does not fit, and the release of
// what a connection held. These are members of TCPStoreServerLoop
// (tcp_store_server_loop.h), whose loop is in tcp_store_server.cpp; the
// protocol and its terms (header, body, parked waiter, refused message) are
// described at the top of tcp_store.cpp.
//
// Bounds
// ------
// Whoever reaches the port can connect, so what a connection can make the
// server hold is bounded before it is read:
//
// - A connection starts *unauthenticated*. Its header bytes go to a 5-byte
//   array in the connection, and check_header() refuses, on the first byte
//   that shows it, anything but a hello no longer than kMaxHelloBytes. So an
//   unauthenticated connection never makes the server buffer more than one
//   hello (274 bytes) and its reply (69 bytes), and it must be *greeted*
//   (hello accepted, token matched) within the handshake timeout or be
//   closed.
// - Every buffered byte is *charged* against one budget, max_buffered_bytes.
//   A request is charged when its header has arrived (*admission*): the
//   announced body length plus a *reply reserve*, the most its reply can be
//   (reply_reserve()), so that the reply is made inside the request's own
//   charge and handling a request never needs more memory. The body buffer
//   is sized at admission but left uninitialised, so that resident memory
//   follows the bytes received, not the length announced. Two replies come
//   from the map, not from the request, and are charged when made: a get's
//   (and a waiter's answer), and a compare_set's that returns a current value
//   larger than its reserve.
// - What does not fit is *throttled*: its connection is not read (its kernel
//   buffer fills and TCP pushes back on the client) until memory is
//   released, and is then retried, oldest first. A get whose value does not
//   fit is parked, holding no buffer, until it does. *Large* charges (over
//   kSmallChargeBytes) may not use the last kSmallReserveBytes of the budget
//   and never overtake an older throttled large charge; small ones (every
//   ordinary store call) may, so that clients holding large messages cannot
//   stall small ones. Any one request with its reply fits in the budget less
//   the reserve (kTCPStoreMinBufferedBytes), so a throttled message fits once
//   the others have drained: admitted bodies complete as their clients send
//   them, replies drain as clients read them, and a client that does neither
//   is closed at its idle deadline. The one wait that could last forever,
//   compare_sets holding every charged byte while each waits for room for a
//   current value, is broken by refusing the oldest of them
//   (break_deadlock()).

#include <ddp/store/tcp_store.h>

#include "store/tcp_store_server_loop.h"
#include "internal/check.h"

#include <algorithm>
#include <string>
#include <vector>

namespace ddp {
namespace internal {

namespace ts = tcp_store;

namespace {

// Charges up to this size are small: every request of a key and a small
// value, every reply but a large value or a long key list.
constexpr size_t kSmallChargeBytes = 128 * 1024;
// The part of the budget that only small charges may use.
constexpr size_t kSmallReserveBytes = size_t{64} << 20;

static_assert(
    static_cast<size_t>(kTCPStoreMinBufferedBytes) ==
        kSmallReserveBytes + ts::kMaxRequestBytes + ts::kMaxReplyBytes,
    "kTCPStoreMinBufferedBytes must hold the reserve and the largest request with its reply");
static_assert(
    ts::kMaxHelloBytes + ts::kMaxHelloReplyBytes <= kSmallChargeBytes,
    "a hello must be a small charge");

// The most the reply to a request of `command` with a body of `length`
// bytes can be, when it is made from the request alone; a get's value comes
// from the map and is charged when its reply is made.
size_t reply_reserve(ts::Command command, uint32_t length) {
  constexpr size_t kHeader = ts::kHeaderBytes;
  switch (command) {
    case ts::Command::kHello:
      return ts::kMaxHelloReplyBytes;
    case ts::Command::kSet:
    case ts::Command::kWait: // a timeout's key list is a parked waiter's answer
    case ts::Command::kGet:
      return kHeader;
    case ts::Command::kAdd:
      // The new value, or a message quoting the key and a little of the value.
      return kHeader + 4 + length + 512;
    case ts::Command::kCompareSet:
      // The expected or desired value, both in the body; a current value may
      // be larger, and is charged then.
      return kHeader + 4 + std::min<size_t>(length, ts::kMaxValueBytes);
    case ts::Command::kCheck:
    case ts::Command::kDeleteKey:
      return kHeader + 1;
    case ts::Command::kNumKeys:
      return kHeader + 8;
  }
  return kHeader;
}

} // namespace

bool TCPStoreServerLoop::admit(uint64_t id, Connection& conn, bool queued) {
  const uint32_t length = ts::body_length(conn.header);
  const size_t reserve = reply_reserve(static_cast<ts::Command>(conn.header[0]), length);
  if (!make_room(id, conn, length + reserve, queued, Throttle::kAdmit)) {
    return false;
  }
  charge(conn.in_charge, length + reserve);
  conn.reply_room = reserve;
  conn.body.resize(length);
  conn.admitted = true;
  conn.received = 0;
  return true;
}

bool TCPStoreServerLoop::fits(size_t bytes, bool queued) const {
  if (bytes <= kSmallChargeBytes) {
    return buffered_ + bytes <= limits_.max_buffered_bytes;
  }
  if (!queued && large_waiting_ > 0) {
    return false; // An older large charge goes first.
  }
  return buffered_ + bytes <= limits_.max_buffered_bytes - kSmallReserveBytes;
}

bool TCPStoreServerLoop::make_room(
    uint64_t id,
    Connection& conn,
    size_t bytes,
    bool queued,
    Throttle kind) {
  if (fits(bytes, queued || conn.throttle != Throttle::kNone)) {
    unthrottle(id, conn);
    return true;
  }
  if (conn.throttle == Throttle::kNone) {
    throttled_.push_back(id);
  } else if (conn.throttled_bytes > kSmallChargeBytes) {
    --large_waiting_;
  }
  conn.throttle = kind;
  conn.throttled_bytes = bytes;
  if (bytes > kSmallChargeBytes) {
    ++large_waiting_;
  }
  return false;
}

void TCPStoreServerLoop::unthrottle(uint64_t id, Connection& conn) {
  if (conn.throttle == Throttle::kNone) {
    return;
  }
  const auto it = std::find(throttled_.begin(), throttled_.end(), id);
  DDP_INTERNAL_ASSERT(it != throttled_.end(), "throttled connection ", id, " is not queued");
  throttled_.erase(it);
  if (conn.throttled_bytes > kSmallChargeBytes) {
    --large_waiting_;
  }
  conn.throttle = Throttle::kNone;
  conn.throttled_bytes = 0;
  conn.last_activity = SteadyClock::now(); // the wait was ours, not idleness
  retry_due_ = true; // those queued behind it may go now
}

void TCPStoreServerLoop::charge(size_t& slot, size_t bytes) {
  slot += bytes;
  buffered_ += bytes;
  DDP_INTERNAL_ASSERT(
      buffered_ <= limits_.max_buffered_bytes, "TCPStore server buffers ", buffered_,
      " bytes, over its bound of ", limits_.max_buffered_bytes);
  const auto now = static_cast<int64_t>(buffered_);
  buffered_published_.store(now, std::memory_order_relaxed);
  if (now > peak_buffered_.load(std::memory_order_relaxed)) {
    peak_buffered_.store(now, std::memory_order_relaxed);
  }
}

void TCPStoreServerLoop::release(size_t& slot, size_t bytes) {
  DDP_INTERNAL_ASSERT(bytes <= slot && bytes <= buffered_, "releasing ", bytes, " bytes of ", slot);
  if (bytes == 0) {
    return;
  }
  slot -= bytes;
  buffered_ -= bytes;
  retry_due_ = true;
  buffered_published_.store(static_cast<int64_t>(buffered_), std::memory_order_relaxed);
}

void TCPStoreServerLoop::retry_throttled() {
  retry_due_ = false;
  // A copy: an attempt may answer, throttle or close other connections.
  const std::vector<uint64_t> queue(throttled_.begin(), throttled_.end());
  bool large_blocked = false;
  for (const uint64_t id : queue) {
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second.closing || it->second.throttle == Throttle::kNone) {
      continue;
    }
    Connection& conn = it->second;
    const bool large = conn.throttled_bytes > kSmallChargeBytes;
    // A large one keeps its place behind an older one that does not fit yet,
    // unless it holds a request already: finishing that frees memory.
    if (large && large_blocked && conn.throttle != Throttle::kRequest) {
      continue;
    }
    bool done = false;
    if (fits(conn.throttled_bytes, /*queued=*/true)) {
      switch (conn.throttle) {
        case Throttle::kAdmit:
          done = admit(id, conn, /*queued=*/true);
          break;
        case Throttle::kRequest:
          done = process(id, conn, /*queued=*/true);
          break;
        case Throttle::kAnswer:
          done = try_answer(id, conn, /*queued=*/true);
          break;
        case Throttle::kNone:
          break;
      }
    }
    if (done) {
      resumed_.push_back(id);
    } else if (large && conn.throttle != Throttle::kNone) {
      large_blocked = true;
    }
  }
}

bool TCPStoreServerLoop::break_deadlock() {
  if (throttled_.empty() || buffered_ == 0) {
    return false;
  }
  size_t waiting = 0;
  Connection* oldest = nullptr; // non-owning: an element of connections_
  for (const uint64_t id : throttled_) {
    Connection& conn = connections_.at(id);
    if (conn.throttle == Throttle::kRequest && !conn.closing) {
      waiting += conn.in_charge + conn.out_charge;
      if (oldest == nullptr) {
        oldest = &conn;
      }
    }
  }
  if (oldest == nullptr || waiting != buffered_) {
    return false; // a body being received or a reply being sent will free memory
  }
  refuse(
      *oldest, "its reply of " + std::to_string(oldest->throttled_bytes + oldest->reply_room) +
          " bytes cannot fit in the store server's buffer bound (" +
          std::to_string(limits_.max_buffered_bytes) +
          " bytes), which requests waiting for room like it hold whole");
  return true;
}

void TCPStoreServerLoop::drop(uint64_t id, Connection& conn) {
  unpark(id, conn);
  unthrottle(id, conn);
  release(conn.in_charge, conn.in_charge);
  release(conn.out_charge, conn.out_charge);
}

} // namespace internal
} // namespace ddp
