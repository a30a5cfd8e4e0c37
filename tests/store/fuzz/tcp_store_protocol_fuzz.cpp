// libFuzzer target: the TCPStore wire protocol as the server reads it, and
// the reply bodies as the client reads them. scripts/fuzz.sh builds and runs
// it; tests/store/fuzz/corpus holds its seeds.
//
// Input. The first byte picks the mode, the rest is the data:
//   even: a byte stream from one client to the server. It goes through the
//         server's own checks in the server's order (tcp_store_server.cpp,
//         TCPStoreServerLoop::pump): check_header() on each header byte as
//         it arrives (nothing but a hello before the handshake), the body
//         limit, parse_request() on each whole body, and the hello's token
//         (bit 1 of the first byte gives the server the token "fuzz").
//   odd:  a reply body, read with the client's parsers; bits 1-3 of the
//         first byte pick which reply (get, add, compare_set, check, wait's
//         timeout, bad request).
//
// Besides the sanitizers (address, undefined), two oracles abort on a wrong
// answer: every request the parser accepts must encode back, with the
// client's Writer, to exactly the bytes it came from (the encoding is
// canonical); and a body accepted under a header must never have been over
// that header's limit.

#include "store/tcp_store_protocol.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ts = ddp::internal::tcp_store;

namespace {

void check(bool ok) {
  if (!ok) {
    std::abort();
  }
}

// The message `request` came from, encoded as the client encodes it.
std::vector<uint8_t> encode(const ts::Request& request) {
  ts::Writer w(static_cast<uint8_t>(request.command));
  switch (request.command) {
    case ts::Command::kHello:
      w.u32(ts::kMagic);
      w.u32(ts::kProtocolVersion);
      w.u8(request.flags);
      w.bytes(request.token);
      break;
    case ts::Command::kSet:
      w.bytes(request.key);
      w.bytes(request.value.data, request.value.size);
      break;
    case ts::Command::kGet:
      w.bytes(request.key);
      w.i64(request.number);
      break;
    case ts::Command::kAdd:
      w.bytes(request.key);
      w.i64(request.number);
      break;
    case ts::Command::kCompareSet:
      w.bytes(request.key);
      w.bytes(request.expected.data, request.expected.size);
      w.bytes(request.value.data, request.value.size);
      break;
    case ts::Command::kCheck:
      w.keys(request.keys);
      break;
    case ts::Command::kWait:
      w.i64(request.number);
      w.keys(request.keys);
      break;
    case ts::Command::kDeleteKey:
      w.bytes(request.key);
      break;
    case ts::Command::kNumKeys:
      break;
  }
  return std::move(w).finish();
}

void fuzz_stream(const uint8_t* data, size_t size, bool server_has_token) {
  const std::string token = server_has_token ? "fuzz" : "";
  bool greeted = false;
  size_t pos = 0;
  while (pos < size) {
    // The header, a byte at a time, as a slow client would send it.
    size_t have = 0;
    while (have < ts::kHeaderBytes && pos + have < size) {
      ++have;
      if (ts::check_header(data + pos, have, greeted).has_value()) {
        return; // refused: the server drops the connection
      }
    }
    if (have < ts::kHeaderBytes) {
      return; // the stream ended inside a header
    }
    const uint8_t* header = data + pos;
    const uint32_t length = ts::body_length(header);
    check(length <= ts::max_request_body(header[0]));
    check(greeted || ts::kHeaderBytes + length <= ts::kMaxHelloBytes);
    if (size - pos - ts::kHeaderBytes < length) {
      return; // the body has not all arrived
    }
    const auto command = static_cast<ts::Command>(header[0]);
    const uint8_t* body = header + ts::kHeaderBytes;
    ts::Request request;
    try {
      request = ts::parse_request(command, body, length);
    } catch (const ts::ProtocolError&) {
      return; // refused
    }
    check(request.command == command);
    check(request.key.size() <= ts::kMaxKeyBytes);
    check(request.keys.size() <= ts::kMaxKeysPerRequest);
    check(request.token.size() <= ts::kMaxTokenBytes);
    // The views lie inside the body.
    for (const ts::ByteView& view : {request.value, request.expected}) {
      check(view.size == 0 || (view.data >= body && view.data + view.size <= body + length));
    }
    const bool timeout = command == ts::Command::kGet || command == ts::Command::kWait;
    check(!timeout || (request.number >= 0 && request.number <= ts::kMaxTimeoutMs));
    // Canonical: a timeout over the maximum is clamped, so compare those
    // only when it was not.
    if (!timeout || request.number < ts::kMaxTimeoutMs) {
      const std::vector<uint8_t> again = encode(request);
      check(again.size() == ts::kHeaderBytes + length);
      check(std::memcmp(again.data(), header, again.size()) == 0);
    }
    if (command == ts::Command::kHello) {
      const bool admitted = token.empty() || ts::token_matches(token, request.token);
      check(admitted == (token.empty() || token == request.token));
      if (!admitted) {
        return; // refused, and closed once the refusal is sent
      }
      greeted = true;
    }
    pos += ts::kHeaderBytes + length;
  }
}

void fuzz_reply(const uint8_t* data, size_t size, uint8_t which) {
  ts::Reader r(data, size);
  try {
    switch (which % 6) {
      case 0: { // get, and the stored value of compare_set
        const std::vector<uint8_t> value = r.bytes(ts::kMaxValueBytes, "value");
        check(value.size() <= size);
        break;
      }
      case 1: // add, num_keys
        r.i64();
        break;
      case 2: { // compare_set, without a copy
        const ts::ByteView view = r.view(ts::kMaxValueBytes, "value");
        check(view.size == 0 || (view.data >= data && view.data + view.size <= data + size));
        break;
      }
      case 3: // check, delete_key
        r.u8();
        break;
      case 4: { // wait's kTimedOut: the keys still missing
        const std::vector<std::string> keys = r.keys();
        size_t total = 4;
        for (const auto& key : keys) {
          total += 4 + key.size();
        }
        check(total <= size);
        break;
      }
      case 5: // kBadRequest's message
        r.string(ts::kMaxKeyBytes * 4, "message");
        break;
    }
    r.finish();
  } catch (const ts::ProtocolError&) {
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  const uint8_t mode = data[0];
  if ((mode & 1) == 0) {
    fuzz_stream(data + 1, size - 1, (mode & 2) != 0);
  } else {
    fuzz_reply(data + 1, size - 1, static_cast<uint8_t>(mode >> 1));
  }
  return 0;
}
