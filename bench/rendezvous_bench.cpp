// Rendezvous at scale: W simulated ranks, each a thread with its own store
// client, do what init_process_group() does before Gloo connects (the
// rendezvous round's "open" key, then comm/rendezvous_arrival.h: claim the
// rank, vote for the world size, arrive, wait for every rank) against one
// store server: ddp's TCPStoreServer (`serve`, started by the driver) or
// PyTorch's (torch.distributed.TCPStore, the server torchrun's agent runs),
// reached through ddp's client of PyTorch's protocol (TorchTCPStore). The
// clients are the same code for both servers, so the difference is the
// server's.
//
// Hostile clients (--hostile N) run alongside the ranks for the whole
// rendezvous, in four kinds taken in turn: garbage bytes, a message that
// claims an oversized body (ddp's protocol only), a slow loris (one byte
// every 100 ms), a silent connection. Each reconnects when dropped.
//
//   rendezvous_bench serve                    ddp's server; prints "port N",
//                                             serves until stdin closes
//   rendezvous_bench clients --port P --world W [--server ddp|torch]
//                    [--hostile N] [--timeout-s S] [--host H]
//
// Prints one line: rendezvous_bench server=ddp world=W hostile=N
// total_s=... connect_max_s=... rank_median_s=... rank_max_s=...
// The driver, run_rendezvous_bench.py, adds the server's CPU and memory.

#include <ddp/store/tcp_store.h>
#include <ddp/store/torch_tcp_store.h>

#include "comm/rendezvous_arrival.h"
#include "store/tcp_store_protocol.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "rendezvous_bench: " << why << "\n"
            << "usage: rendezvous_bench serve\n"
            << "       rendezvous_bench clients --port P --world W [--server ddp|torch] "
               "[--hostile N] [--timeout-s S] [--host H]\n";
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& text, int minimum) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < minimum || value > (1 << 20)) {
    usage(flag + " takes a whole number >= " + std::to_string(minimum) + ", got '" + text + "'");
  }
  return static_cast<int>(value);
}

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  int world = 0;
  std::string server = "ddp";
  int hostile = 0;
  int timeout_s = 120;
};

// Opens the gate for every thread at once, so that the ranks arrive as a
// crowd, as they do when a job starts.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    opened_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

int connect_raw(const Options& options) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return -1;
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(options.port));
  ::inet_pton(AF_INET, options.host.c_str(), &address.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has closed `fd` (waits at most `ms`).
bool closed_by_peer(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) {
    return false;
  }
  char buffer[4096];
  const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// One hostile client of kind `kind` until `stop`. Counts its connections.
void hostile_client(const Options& options, int kind, const std::atomic<bool>& stop,
                    std::atomic<int64_t>& connections) {
  namespace ts = ddp::internal::tcp_store;
  while (!stop.load()) {
    const int fd = connect_raw(options);
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    ++connections;
    std::vector<uint8_t> bytes;
    if (kind == 0) { // garbage
      for (int i = 0; i < 64; ++i) {
        bytes.push_back(static_cast<uint8_t>((i * 131 + 7) & 0xff));
      }
    } else if (kind == 1 && options.server == "ddp") { // a valid hello, then a huge claim
      ts::Writer hello(static_cast<uint8_t>(ts::Command::kHello));
      hello.u32(ts::kMagic);
      hello.u32(ts::kProtocolVersion);
      hello.u8(0);
      hello.bytes(std::string());
      bytes = std::move(hello).finish();
      const uint8_t set = static_cast<uint8_t>(ts::Command::kSet);
      bytes.insert(bytes.end(), {set, 0xff, 0xff, 0xff, 0xf0});
    }
    if (!bytes.empty()) {
      (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      while (!stop.load() && !closed_by_peer(fd, 100)) {
      }
    } else if (kind == 2) { // slow loris: one byte every 100 ms
      const uint8_t byte = 1;
      while (!stop.load() && ::send(fd, &byte, 1, MSG_NOSIGNAL) == 1 && !closed_by_peer(fd, 100)) {
      }
    } else { // silent
      while (!stop.load() && !closed_by_peer(fd, 100)) {
      }
    }
    ::close(fd);
  }
}

struct RankTimes {
  double connected_s = 0;
  double done_s = 0;
  std::string error;
};

std::shared_ptr<ddp::Store> connect_store(const Options& options) {
  const auto timeout = std::chrono::milliseconds(int64_t{options.timeout_s} * 1000);
  if (options.server == "torch") {
    return std::make_shared<ddp::TorchTCPStore>(
        options.host, ddp::TorchTCPStoreOptions().port(options.port).timeout(timeout));
  }
  return std::make_shared<ddp::TCPStore>(
      options.host, ddp::TCPStoreOptions().port(options.port).timeout(timeout));
}

int run_clients(const Options& options) {
  const auto timeout = std::chrono::milliseconds(int64_t{options.timeout_s} * 1000);
  // A prefix of this run's own, so that runs against one server keep apart.
  const std::string prefix = "bench/rendezvous/" + std::to_string(::getpid()) + "-" +
      std::to_string(Clock::now().time_since_epoch().count()) + "/";
  Gate gate;
  Clock::time_point start;
  std::vector<RankTimes> times(static_cast<size_t>(options.world));
  std::vector<std::thread> ranks;
  ranks.reserve(times.size());
  for (int r = 0; r < options.world; ++r) {
    ranks.emplace_back([&, r] {
      gate.wait();
      auto& mine = times[static_cast<size_t>(r)];
      try {
        auto store = connect_store(options);
        mine.connected_s = seconds_between(start, Clock::now());
        if (r == 0) {
          store->set(prefix + "open", std::string("1"));
        } else {
          store->wait({prefix + "open"}, timeout);
        }
        const std::string who = "[rank " + std::to_string(r) + "/" + std::to_string(options.world) + "]";
        ddp::internal::wait_for_all_ranks(*store, prefix, r, options.world, timeout, who);
        mine.done_s = seconds_between(start, Clock::now());
      } catch (const std::exception& e) {
        mine.error = e.what();
      }
    });
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> hostile_connections{0};
  std::vector<std::thread> hostile;
  for (int h = 0; h < options.hostile; ++h) {
    hostile.emplace_back(
        [&, h] { hostile_client(options, h % 4, stop, hostile_connections); });
  }
  if (options.hostile > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500)); // let them settle in
  }
  start = Clock::now();
  gate.open();
  for (auto& t : ranks) {
    t.join();
  }
  const double total_s = seconds_between(start, Clock::now());
  stop = true;
  for (auto& t : hostile) {
    t.join();
  }
  int failed = 0;
  std::vector<double> done;
  double connect_max = 0;
  for (size_t r = 0; r < times.size(); ++r) {
    if (!times[r].error.empty()) {
      if (failed++ < 5) {
        std::cerr << "rendezvous_bench: rank " << r << " failed: " << times[r].error << "\n";
      }
      continue;
    }
    done.push_back(times[r].done_s);
    connect_max = std::max(connect_max, times[r].connected_s);
  }
  if (failed > 0) {
    std::cerr << "rendezvous_bench: " << failed << " of " << options.world
              << " ranks failed their rendezvous\n";
    return 1;
  }
  std::sort(done.begin(), done.end());
  std::printf(
      "rendezvous_bench server=%s world=%d hostile=%d total_s=%.3f connect_max_s=%.3f "
      "rank_median_s=%.3f rank_max_s=%.3f hostile_connections=%lld\n",
      options.server.c_str(), options.world, options.hostile, total_s, connect_max,
      done[done.size() / 2], done.back(), static_cast<long long>(hostile_connections.load()));
  return 0;
}

int serve() {
  ddp::TCPStoreServer server(ddp::TCPStoreServerOptions().port(0));
  std::printf("port %d\n", server.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage("say serve or clients");
  }
  const std::string mode = argv[1];
  try {
    if (mode == "serve") {
      return serve();
    }
    if (mode != "clients") {
      usage("unknown mode '" + mode + "'");
    }
    Options options;
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) {
        usage(flag + " needs a value");
      }
      const std::string value = argv[++i];
      if (flag == "--port") {
        options.port = parse_int(flag, value, 1);
      } else if (flag == "--world") {
        options.world = parse_int(flag, value, 1);
      } else if (flag == "--hostile") {
        options.hostile = parse_int(flag, value, 0);
      } else if (flag == "--timeout-s") {
        options.timeout_s = parse_int(flag, value, 1);
      } else if (flag == "--host") {
        options.host = value;
      } else if (flag == "--server") {
        if (value != "ddp" && value != "torch") {
          usage("--server is ddp or torch, got '" + value + "'");
        }
        options.server = value;
      } else {
        usage("unknown flag " + flag);
      }
    }
    if (options.port == 0 || options.world == 0) {
      usage("--port and --world are needed");
    }
    return run_clients(options);
  } catch (const std::exception& e) {
    std::cerr << "rendezvous_bench: " << e.what() << "\n";
    return 1;
  }
}
