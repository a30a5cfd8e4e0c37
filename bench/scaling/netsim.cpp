// ddp_netsim: the switch of a simulated cluster. Each host is a network
// namespace holding a tap device, sim0; this process holds the other end of
// every tap and forwards Ethernet frames between them as a switch whose
// ports are links of a given bandwidth and latency: a frame leaves its host
// no faster than the host's link sends (its uplink), enters the destination
// host no faster than that host's link receives (its downlink), and arrives
// the latency later. Frames that would wait longer than the buffer allows
// are dropped, as a switch's full queue drops them (TCP recovers). The
// kernel's netem, which does this in the kernel, is not built into this
// machine's kernel (CONFIG_NET_SCH_NETEM is not set); tbf is, but it shapes
// bandwidth only. See bench/scaling/README.md.
//
// Usage: ddp_netsim --netns h0,h1,... --rate-mbit R --latency-us L
//                   [--buffer-kb K] [--ready-file PATH]
// Creates sim0 in each namespace, writes PATH (when given) once they exist,
// and forwards until SIGINT or SIGTERM; the taps go with the process.
// Plain C++17 and Linux; needs CAP_NET_ADMIN and CAP_SYS_ADMIN (setns).

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0;

void on_signal(int) {
  g_stop = 1;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ddp_netsim: %s\n", what.c_str());
  std::exit(1);
}

int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

struct Frame {
  int64_t deliver_ns;
  std::vector<uint8_t> bytes;
};

struct Port {
  std::string netns;
  int fd = -1;
  int64_t uplink_free_ns = 0;   // when the host's link is next free to send
  int64_t downlink_free_ns = 0; // when the link into the host is next free
  std::deque<Frame> queue;      // frames for this host, in delivery order
  int64_t received = 0, delivered = 0, dropped = 0;
};

// Opens sim0 inside the namespace /var/run/netns/<name>; returns its fd.
int open_tap_in(const std::string& name, int home_ns) {
  const std::string path = "/var/run/netns/" + name;
  const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0) {
    die("cannot open " + path + ": " + std::strerror(errno) + " (create it with `ip netns add " + name + "`)");
  }
  if (::setns(ns, CLONE_NEWNET) != 0) {
    die("setns into " + name + ": " + std::strerror(errno));
  }
  ::close(ns);
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    die(std::string("cannot open /dev/net/tun: ") + std::strerror(errno));
  }
  ifreq request{};
  request.ifr_flags = IFF_TAP | IFF_NO_PI;
  std::strncpy(request.ifr_name, "sim0", IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &request) != 0) {
    die("cannot create tap sim0 in " + name + ": " + std::strerror(errno));
  }
  if (::setns(home_ns, CLONE_NEWNET) != 0) {
    die(std::string("setns back: ") + std::strerror(errno));
  }
  return fd;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names;
  double rate_mbit = 0;
  double latency_us = -1;
  double buffer_kb = 4096;
  std::string ready_file;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      die("option " + flag + " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--netns") {
      std::stringstream list(value);
      std::string name;
      while (std::getline(list, name, ',')) {
        names.push_back(name);
      }
    } else if (flag == "--rate-mbit") {
      rate_mbit = std::atof(value.c_str());
    } else if (flag == "--latency-us") {
      latency_us = std::atof(value.c_str());
    } else if (flag == "--buffer-kb") {
      buffer_kb = std::atof(value.c_str());
    } else if (flag == "--ready-file") {
      ready_file = value;
    } else {
      die("unknown option " + flag);
    }
  }
  if (names.size() < 2 || rate_mbit <= 0 || latency_us < 0 || buffer_kb <= 0) {
    die("usage: ddp_netsim --netns h0,h1[,...] --rate-mbit R (> 0) --latency-us L (>= 0) [--buffer-kb K] "
        "[--ready-file PATH]");
  }
  // Wake-ups to the microsecond: the default timer slack (50 us) would add
  // to every frame's latency.
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  const double ns_per_byte = 8e3 / rate_mbit; // 1 Mbit/s = 1e6 bits/s
  const auto latency_ns = static_cast<int64_t>(latency_us * 1e3);
  const auto buffer_ns = static_cast<int64_t>(buffer_kb * 1024 * ns_per_byte);

  const int home = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) {
    die(std::string("cannot open /proc/self/ns/net: ") + std::strerror(errno));
  }
  std::vector<Port> ports(names.size());
  for (size_t p = 0; p < names.size(); ++p) {
    ports[p].netns = names[p];
    ports[p].fd = open_tap_in(names[p], home);
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  if (!ready_file.empty()) {
    FILE* ready = std::fopen(ready_file.c_str(), "w");
    if (ready == nullptr) {
      die("cannot write " + ready_file);
    }
    std::fprintf(ready, "%d\n", static_cast<int>(::getpid()));
    std::fclose(ready);
  }

  std::map<std::vector<uint8_t>, size_t> where; // a MAC address's port, as learnt
  std::vector<pollfd> polls(ports.size());
  std::vector<uint8_t> buffer(70000);
  while (!g_stop) {
    // Deliver what is due; find the next time something is.
    int64_t now = now_ns();
    int64_t next = -1;
    for (auto& port : ports) {
      while (!port.queue.empty() && port.queue.front().deliver_ns <= now) {
        const Frame& frame = port.queue.front();
        const ssize_t n = ::write(port.fd, frame.bytes.data(), frame.bytes.size());
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          break; // the tap's queue is full: try again shortly
        }
        ++port.delivered;
        port.queue.pop_front();
      }
      if (!port.queue.empty()) {
        const int64_t due = port.queue.front().deliver_ns;
        next = next < 0 ? due : std::min(next, due);
      }
    }
    for (size_t p = 0; p < ports.size(); ++p) {
      polls[p] = {ports[p].fd, POLLIN, 0};
    }
    timespec wait{};
    timespec* timeout = nullptr;
    if (next >= 0) {
      const int64_t in = std::max<int64_t>(next - now_ns(), 0);
      wait.tv_sec = in / 1000000000;
      wait.tv_nsec = in % 1000000000;
      timeout = &wait;
    }
    if (::ppoll(polls.data(), polls.size(), timeout, nullptr) < 0 && errno != EINTR) {
      die(std::string("ppoll: ") + std::strerror(errno));
    }
    for (size_t p = 0; p < ports.size(); ++p) {
      if ((polls[p].revents & POLLIN) == 0) {
        continue;
      }
      for (int k = 0; k < 64; ++k) { // a bounded batch per port per round
        const ssize_t n = ::read(ports[p].fd, buffer.data(), buffer.size());
        if (n <= 0) {
          break;
        }
        if (n < 14) {
          continue; // not an Ethernet frame
        }
        Port& from = ports[p];
        ++from.received;
        now = now_ns();
        where[std::vector<uint8_t>(buffer.begin() + 6, buffer.begin() + 12)] = p;
        const double wire_ns = static_cast<double>(n) * ns_per_byte;
        const int64_t up_start = std::max(now, from.uplink_free_ns);
        if (up_start - now > buffer_ns) {
          ++from.dropped; // the host's link is backed up past the buffer
          continue;
        }
        from.uplink_free_ns = up_start + static_cast<int64_t>(wire_ns);
        std::vector<size_t> targets;
        const bool group = (buffer[0] & 1) != 0;
        const auto known = where.find(std::vector<uint8_t>(buffer.begin(), buffer.begin() + 6));
        if (!group && known != where.end()) {
          if (known->second != p) {
            targets.push_back(known->second);
          }
        } else {
          for (size_t q = 0; q < ports.size(); ++q) {
            if (q != p) {
              targets.push_back(q);
            }
          }
        }
        for (const size_t q : targets) {
          Port& to = ports[q];
          const int64_t down_start = std::max(from.uplink_free_ns, to.downlink_free_ns);
          if (down_start - from.uplink_free_ns > buffer_ns) {
            ++to.dropped;
            continue;
          }
          to.downlink_free_ns = down_start + static_cast<int64_t>(wire_ns);
          to.queue.push_back(Frame{to.downlink_free_ns + latency_ns,
                                   std::vector<uint8_t>(buffer.begin(), buffer.begin() + n)});
        }
      }
    }
  }
  for (const auto& port : ports) {
    std::fprintf(stderr, "ddp_netsim: %s: %lld frames from it, %lld delivered to it, %lld dropped\n",
                 port.netns.c_str(), static_cast<long long>(port.received), static_cast<long long>(port.delivered),
                 static_cast<long long>(port.dropped));
    ::close(port.fd);
  }
  return 0;
}
