// What is particular to the TCPStore: many clients, a late server, a dead
// server, malformed messages, port 0, addresses.

#include <ddp/comm/error.h>
#include <ddp/store/tcp_store.h>

#include "store/socket.h"
#include "store/tcp_store_protocol.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace ts = internal::tcp_store;

constexpr milliseconds kTimeout{10000};

milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

TCPStoreOptions client_options(int port, milliseconds timeout = kTimeout) {
  return TCPStoreOptions().port(port).timeout(timeout);
}

// A port nothing listens on right now (a server picks it, then goes).
int unused_port() {
  TCPStoreServer server(0);
  return server.port();
}

// A raw connection for speaking the protocol by hand.
internal::Socket raw_connect(int port) {
  auto result = internal::try_connect("127.0.0.1", port, Clock::now() + milliseconds(5000));
  EXPECT_TRUE(result.socket.valid()) << result.error;
  return std::move(result.socket);
}

void raw_send(const internal::Socket& socket, const std::vector<uint8_t>& data) {
  auto result = internal::send_all(socket.fd(), data.data(), data.size(), Clock::now() + milliseconds(5000));
  ASSERT_EQ(result.status, internal::IoStatus::kOk) << internal::describe(result);
}

std::vector<uint8_t> header(uint8_t kind, uint32_t length) {
  return {kind, static_cast<uint8_t>(length >> 24), static_cast<uint8_t>(length >> 16),
          static_cast<uint8_t>(length >> 8), static_cast<uint8_t>(length)};
}

std::vector<uint8_t> hello() {
  ts::Writer w(static_cast<uint8_t>(ts::Command::kHello));
  w.u32(ts::kMagic);
  w.u32(ts::kProtocolVersion);
  w.u8(0);
  w.bytes(std::string()); // no token
  return std::move(w).finish();
}

// Reads the hello reply, then expects the server to close the connection
// within 3 s, without sending anything more.
void expect_closed_by_server(const internal::Socket& socket, bool greeted) {
  const auto deadline = Clock::now() + milliseconds(3000);
  if (greeted) {
    // kOk and the server's idle timeout.
    uint8_t reply[ts::kHeaderBytes + 8];
    auto r = internal::recv_all(socket.fd(), reply, sizeof(reply), deadline);
    ASSERT_EQ(r.status, internal::IoStatus::kOk) << internal::describe(r);
    EXPECT_EQ(reply[0], static_cast<uint8_t>(ts::Status::kOk));
    EXPECT_EQ(ts::body_length(reply), 8u);
  }
  uint8_t byte = 0;
  auto r = internal::recv_all(socket.fd(), &byte, 1, deadline);
  EXPECT_TRUE(r.status == internal::IoStatus::kClosed || r.status == internal::IoStatus::kFailed)
      << "the server kept the connection open: " << internal::describe(r);
}

// A process that forks without exec gives its child a copy of every
// descriptor, the server's connections included. A connection the server
// then drops stays in its epoll set while the child holds the copy, and a
// client gone away is readable (at end of file) for ever: unless the server
// takes the connection out of the set itself, it wakes at once every time,
// spinning a core (Note [epoll] in src/store/tcp_store_server_epoll.cpp).
TEST(TCPStoreTest, AConnectionDroppedWhileAForkedChildHoldsItDoesNotSpinTheServer) {
  TCPStoreServer server(0);
  {
    TCPStore setter("127.0.0.1", client_options(server.port()));
    setter.set("k", std::vector<uint8_t>{1});
  }
  internal::Socket client = raw_connect(server.port());
  std::this_thread::sleep_for(milliseconds(300)); // accepted by now
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child keeps the server's end and lets go of the client's, so
    // that the client's close reaches the server.
    ::close(client.fd());
    ::sleep(4);
    ::_exit(0);
  }
  client.reset(); // the server sees the end of file and drops the connection
  std::this_thread::sleep_for(milliseconds(300));
  const auto cpu_seconds = [] {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
        (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  };
  const double before = cpu_seconds();
  std::this_thread::sleep_for(milliseconds(1000));
  const double used = cpu_seconds() - before;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_LT(used, 0.3) << "the server used " << used << " s of CPU in 1 s with nothing to do";
  // And it still serves.
  TCPStore again("127.0.0.1", client_options(server.port()));
  EXPECT_EQ(again.get("k"), std::vector<uint8_t>{1});
}

TEST(TCPStoreTest, PortZeroPicksAFreePort) {
  TCPStore a("127.0.0.1", TCPStoreOptions().port(0).is_server(true).timeout(kTimeout));
  TCPStore b("127.0.0.1", TCPStoreOptions().port(0).is_server(true).timeout(kTimeout));
  EXPECT_GT(a.port(), 0);
  EXPECT_GT(b.port(), 0);
  EXPECT_NE(a.port(), b.port());
  ASSERT_NE(a.server(), nullptr);
  EXPECT_EQ(a.server()->port(), a.port());
  // A client finds it by name, and sees the server side's keys.
  a.set("k", std::string("v"));
  TCPStore client("localhost", client_options(a.port()));
  EXPECT_EQ(client.server(), nullptr);
  EXPECT_EQ(client.port(), a.port());
  EXPECT_EQ(client.get_string("k"), "v");
  EXPECT_FALSE(b.check({"k"}));
}

TEST(TCPStoreTest, Ipv6LoopbackWorksWhereTheHostHasIt) {
  internal::Socket probe(::socket(AF_INET6, SOCK_STREAM, 0));
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  if (!probe.valid() ||
      ::bind(probe.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    GTEST_SKIP() << "no IPv6 loopback on this host";
  }
  TCPStoreServer server(0);
  TCPStore client("::1", client_options(server.port()));
  TCPStore bracketed("[::1]", client_options(server.port()));
  client.set("six", std::string("6"));
  EXPECT_EQ(bracketed.get_string("six"), "6");
}

TEST(TCPStoreTest, ThirtyTwoConcurrentClients) {
  constexpr int kClients = 32;
  constexpr int kAdds = 20;
  TCPStore server("127.0.0.1", TCPStoreOptions().port(0).is_server(true).timeout(kTimeout));
  std::atomic<int> failures{0};
  std::vector<std::string> done_keys;
  for (int rank = 0; rank < kClients; ++rank) {
    done_keys.push_back("done/" + std::to_string(rank));
  }
  std::vector<std::string> finals(kClients);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kClients; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        TCPStore client("127.0.0.1", client_options(server.port()));
        for (int i = 0; i < kAdds; ++i) {
          client.add("counter", rank + 1);
        }
        client.set(done_keys[rank], std::string("1"));
        client.wait(done_keys);
        finals[rank] = client.get_string("counter");
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << rank << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(failures.load(), 0);
  // Each rank r adds r + 1, kAdds times: kAdds * W (W + 1) / 2.
  const std::string expected = std::to_string(kAdds * kClients * (kClients + 1) / 2);
  for (int rank = 0; rank < kClients; ++rank) {
    EXPECT_EQ(finals[rank], expected) << "rank " << rank;
  }
  EXPECT_EQ(server.get_string("counter"), expected);
  EXPECT_EQ(server.num_keys(), kClients + 1);
  // The server side's own client, plus one per TCPStore object.
  EXPECT_EQ(server.server()->num_workers_connected(), kClients + 1);
}

TEST(TCPStoreTest, ServerWaitsForNumWorkers) {
  const int port = unused_port();
  std::unique_ptr<TCPStore> server;
  Clock::time_point server_ready;
  std::thread server_thread([&] {
    server = std::make_unique<TCPStore>(
        "127.0.0.1", TCPStoreOptions().port(port).is_server(true).num_workers(3).timeout(kTimeout));
    server_ready = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(100));
  TCPStore first("127.0.0.1", client_options(port));
  std::this_thread::sleep_for(milliseconds(200));
  const auto second_start = Clock::now();
  TCPStore second("127.0.0.1", client_options(port));
  server_thread.join();
  ASSERT_NE(server, nullptr);
  // The server's constructor returned only once the third worker was in.
  EXPECT_GE(server_ready, second_start);
  EXPECT_EQ(server->server()->num_workers_connected(), 3);
}

TEST(TCPStoreTest, NumWorkersTimesOut) {
  const auto start = Clock::now();
  try {
    TCPStore server(
        "127.0.0.1",
        TCPStoreOptions().port(0).is_server(true).num_workers(2).timeout(milliseconds(300)));
    FAIL() << "the server did not time out waiting for workers";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("2 workers"), std::string::npos) << message;
    EXPECT_NE(message.find("(1 connected)"), std::string::npos) << message;
  }
  EXPECT_GE(since(start).count(), 290);
  EXPECT_LT(since(start).count(), 3000);
}

TEST(TCPStoreTest, ClientStartedBeforeTheServerConnectsOnceItIsUp) {
  const int port = unused_port();
  std::atomic<bool> connected{false};
  std::string error;
  const auto start = Clock::now();
  milliseconds connect_time{0};
  std::thread client_thread([&] {
    try {
      TCPStore client("127.0.0.1", client_options(port));
      connect_time = since(start);
      connected = true;
      client.set("early", std::string("bird"));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_FALSE(connected.load());
  TCPStore server("127.0.0.1", TCPStoreOptions().port(port).is_server(true).timeout(kTimeout));
  client_thread.join();
  EXPECT_EQ(error, "");
  EXPECT_TRUE(connected.load());
  EXPECT_GE(connect_time.count(), 390);
  EXPECT_LT(connect_time.count(), 5000);
  EXPECT_EQ(server.get_string("early"), "bird");
}

TEST(TCPStoreTest, ConnectTimesOutWhenNoServerComes) {
  const int port = unused_port();
  const auto start = Clock::now();
  try {
    TCPStore client("127.0.0.1", client_options(port, milliseconds(300)));
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << message;
    EXPECT_NE(message.find("300 ms"), std::string::npos) << message;
  }
  EXPECT_GE(since(start).count(), 290);
  EXPECT_LT(since(start).count(), 3000);
}

TEST(TCPStoreTest, TimeoutMessageNamesKeysTimeoutAndServer) {
  TCPStoreServer server(0);
  TCPStore client("127.0.0.1", client_options(server.port()));
  try {
    client.wait({"a", "b"}, milliseconds(200));
    FAIL() << "wait did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "TCPStore wait: timed out after 200 ms waiting for keys [a, b] at 127.0.0.1:" +
            std::to_string(server.port()));
  }
}

TEST(TCPStoreTest, MalformedMessagesAreRefusedAndTheServerServesOthers) {
  TCPStoreServer server(0);
  TCPStore before("127.0.0.1", client_options(server.port()));
  before.set("k", std::string("v"));
  ::testing::internal::CaptureStderr();
  {
    // An absurd length prefix, with no body behind it: refused on the header
    // alone (were it waiting for 4 GiB, the connection would stay open).
    auto socket = raw_connect(server.port());
    raw_send(socket, header(static_cast<uint8_t>(ts::Command::kSet), 0xfffffff0u));
    expect_closed_by_server(socket, /*greeted=*/false);
  }
  {
    // Just over the limit of a set: value limit plus a key's worth, plus one.
    auto socket = raw_connect(server.port());
    raw_send(socket, hello());
    raw_send(socket, header(static_cast<uint8_t>(ts::Command::kSet), ts::max_request_body(2) + 1));
    expect_closed_by_server(socket, /*greeted=*/true);
  }
  {
    // An unknown command byte.
    auto socket = raw_connect(server.port());
    raw_send(socket, hello());
    raw_send(socket, header(0xee, 0));
    expect_closed_by_server(socket, /*greeted=*/true);
  }
  {
    // A key length inside the body that runs past the body.
    auto socket = raw_connect(server.port());
    raw_send(socket, hello());
    std::vector<uint8_t> message = header(static_cast<uint8_t>(ts::Command::kGet), 16);
    const std::vector<uint8_t> body{0x00, 0x00, 0xff, 0xff, 'k', 'e', 'y', 0, 0, 0, 0, 0, 0, 0, 0, 0};
    message.insert(message.end(), body.begin(), body.end());
    raw_send(socket, message);
    expect_closed_by_server(socket, /*greeted=*/true);
  }
  {
    // A request before the hello.
    auto socket = raw_connect(server.port());
    raw_send(socket, header(static_cast<uint8_t>(ts::Command::kNumKeys), 0));
    expect_closed_by_server(socket, /*greeted=*/false);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("over the limit of " + std::to_string(ts::max_request_body(2))), std::string::npos) << log;
  EXPECT_NE(log.find("unknown command byte 238"), std::string::npos) << log;
  EXPECT_NE(log.find("first request of a connection must be a hello"), std::string::npos) << log;
  size_t refusals = 0;
  for (size_t at = log.find("refused"); at != std::string::npos; at = log.find("refused", at + 1)) {
    ++refusals;
  }
  EXPECT_EQ(refusals, 5u) << log;
  // Old and new clients are served as before.
  EXPECT_EQ(before.get_string("k"), "v");
  TCPStore after("127.0.0.1", client_options(server.port()));
  after.set("k2", std::string("v2"));
  EXPECT_EQ(after.get_string("k"), "v");
  EXPECT_EQ(before.get_string("k2"), "v2");
}

TEST(TCPStoreTest, OversizedKeysAndValuesAreMisuse) {
  TCPStoreServer server(0);
  TCPStore client("127.0.0.1", client_options(server.port()));
  const std::string long_key(ts::kMaxKeyBytes + 1, 'k');
  EXPECT_THROW(client.set(long_key, std::string("v")), c10::Error);
  EXPECT_THROW(client.wait({"ok", long_key}), c10::Error);
  const std::string max_key(ts::kMaxKeyBytes, 'k');
  client.set(max_key, std::string("v"));
  EXPECT_EQ(client.get_string(max_key), "v");
}

TEST(TCPStoreTest, OptionsAreValidated) {
  try {
    TCPStore store("127.0.0.1", TCPStoreOptions().port(-1));
    FAIL() << "port -1 was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("(got -1)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TCPStore("127.0.0.1", TCPStoreOptions().port(0)), c10::Error);
  EXPECT_THROW(TCPStore("127.0.0.1", TCPStoreOptions().port(70000).is_server(true)), c10::Error);
  EXPECT_THROW(
      TCPStore("127.0.0.1", TCPStoreOptions().port(0).is_server(true).num_workers(0)), c10::Error);
  EXPECT_THROW(TCPStore("", TCPStoreOptions().port(1234)), c10::Error);
}

TEST(TCPStoreTest, PortInUseIsAnIoError) {
  TCPStoreServer first(0);
  EXPECT_THROW(TCPStoreServer second(first.port()), IoError);
}

TEST(TCPStoreTest, ParkedWaitersDoNotHoldUpOtherClients) {
  TCPStoreServer server(0);
  TCPStore waiter("127.0.0.1", client_options(server.port()));
  TCPStore writer("127.0.0.1", client_options(server.port()));
  std::vector<std::string> keys;
  for (int i = 0; i < 1000; ++i) {
    keys.push_back("key/" + std::to_string(i));
  }
  std::thread wait_thread([&] { waiter.wait(keys, milliseconds(8000)); });
  const auto start = Clock::now();
  for (const auto& key : keys) {
    writer.set(key, key);
  }
  wait_thread.join();
  EXPECT_LT(since(start).count(), 8000);
  EXPECT_EQ(waiter.num_keys(), 1000);
}

TEST(TCPStoreTest, DestroyingTheServerWakesABlockedWaitWithIoError) {
  auto server = std::make_unique<TCPStoreServer>(0);
  TCPStore client("127.0.0.1", client_options(server->port(), milliseconds(30000)));
  std::string error;
  Clock::time_point thrown_at;
  std::thread wait_thread([&] {
    try {
      client.wait({"never"});
    } catch (const IoError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("wrong exception: ") + e.what();
    }
    thrown_at = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(200));
  const auto destroyed_at = Clock::now();
  server.reset();
  wait_thread.join();
  EXPECT_NE(error.find("lost the connection"), std::string::npos) << error;
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(thrown_at - destroyed_at).count(), 3000);
  // Later calls fail at once too: nothing listens any more.
  const auto start = Clock::now();
  EXPECT_THROW(client.set("x", std::string("y")), IoError);
  EXPECT_LT(since(start).count(), 3000);
}

TEST(TCPStoreTest, KillingTheServerProcessWakesABlockedWaitWithIoError) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child only serves; no torch, no gtest.
    ::close(pipe_fds[0]);
    try {
      TCPStoreServer server(0);
      const int port = server.port();
      if (::write(pipe_fds[1], &port, sizeof(port)) != sizeof(port)) {
        ::_exit(2);
      }
      std::this_thread::sleep_for(std::chrono::seconds(30)); // killed long before
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  int port = 0;
  pollfd p{pipe_fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the server process did not start";
  ASSERT_EQ(::read(pipe_fds[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  ::close(pipe_fds[0]);

  TCPStore client("127.0.0.1", client_options(port, milliseconds(30000)));
  client.set("alive", std::string("1"));
  std::string error;
  Clock::time_point thrown_at;
  std::thread wait_thread([&] {
    try {
      client.get("never");
    } catch (const IoError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("wrong exception: ") + e.what();
    }
    thrown_at = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(200));
  const auto killed_at = Clock::now();
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  wait_thread.join();
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_NE(error.find("lost the connection"), std::string::npos) << error;
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(thrown_at - killed_at).count(), 3000);
}

} // namespace
} // namespace ddp
