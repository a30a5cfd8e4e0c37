#include "comm/gloo/gloo_rendezvous.h"

#include <dirent.h>
#include <dlfcn.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <ddp/comm/error.h>

#include "comm/gloo/gloo_origin.h"
#include "comm/gloo/sigpipe_guard.h"
#include "internal/env.h"

namespace ddp::internal {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<ddp::Store> store, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  // Gloo calls get only after wait, but a deadline costs nothing here.
  store_->wait({prefix_ + key}, timeout_);
  auto value = store_->get(prefix_ + key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  store_->wait(prefixed(keys), timeout_);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_->wait(prefixed(keys), timeout);
}

std::vector<std::string> GlooStoreAdapter::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> result;
  result.reserve(keys.size());
  for (const auto& key : keys) {
    result.push_back(prefix_ + key);
  }
  return result;
}

namespace {

// The local address of the route to `host`: connecting a UDP socket sends
// nothing but makes the kernel pick the outgoing interface.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) {
    return "";
  }
  std::string result;
  for (addrinfo* ai = found; ai != nullptr && result.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) {
      continue;
    }
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* address = local.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, address, text, sizeof(text)) != nullptr) {
        result = text;
      }
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  return result;
}

bool resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const bool ok = getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0 && found != nullptr;
  if (found != nullptr) {
    freeaddrinfo(found);
  }
  return ok;
}

} // namespace

DeviceChoice choose_device(const std::string& interface, const std::string& hostname,
                           const std::string& master_addr, int size) {
  if (!interface.empty()) {
    return {interface, "", "the interface given in ProcessGroupGlooOptions"};
  }
  for (const auto* var : {&kEnvSocketIfname, &kEnvGlooSocketIfname}) {
    auto value = env_get(*var);
    if (value && !value->empty()) {
      // Like GLOO_SOCKET_IFNAME, a comma-separated list is allowed; one
      // device per group is enough for us, so the first name is used.
      return {value->substr(0, value->find(',')), "", c10::str("$", var->name)};
    }
  }
  if (!hostname.empty()) {
    return {"", hostname, "the hostname given in ProcessGroupGlooOptions"};
  }
  if (size == 1) {
    return {"", "127.0.0.1", "a world of size 1 (loopback)"};
  }
  if (!master_addr.empty()) {
    const std::string local = local_address_towards(master_addr);
    if (!local.empty()) {
      return {"", local, c10::str("the route to MASTER_ADDR ", master_addr)};
    }
  }
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0 && resolves(name)) {
    return {"", name, "this host's name"};
  }
  return {"", "127.0.0.1", "no other choice (loopback)"};
}

std::shared_ptr<gloo::transport::Device> make_gloo_device(const DeviceChoice& choice,
                                                          const std::string& who) {
  gloo::transport::tcp::attr attr;
  if (!choice.interface.empty()) {
    attr.iface = choice.interface;
  } else {
    attr.hostname = choice.hostname;
  }
  try {
    // Gloo's event-loop thread starts here, with this thread's signal mask:
    // See Note [SIGPIPE and Gloo].
    internal::SigpipeGuard guard;
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw IoError(c10::str(
        who, " init_process_group: cannot create Gloo's TCP device on ",
        choice.interface.empty() ? "address '" + choice.hostname + "'"
                                 : "interface '" + choice.interface + "'",
        " (chosen from ", choice.reason, "): ", error_message(e),
        ". Set DDP_SOCKET_IFNAME to an interface that reaches the other ranks."));
  }
}

} // namespace ddp::internal

namespace ddp::internal {

namespace {

// How Gloo prints an address, "[ip]:port", in both ways that its versions
// print the port: as the raw network-order field, and in host order.
std::vector<std::string> gloo_address_forms(const sockaddr_storage& address) {
  char ip[INET6_ADDRSTRLEN] = "none";
  uint16_t raw_port = 0;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    raw_port = in->sin_port;
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    raw_port = in6->sin6_port;
  } else {
    return {};
  }
  std::vector<std::string> forms{c10::str("[", ip, "]:", raw_port)};
  if (ntohs(raw_port) != raw_port) {
    forms.push_back(c10::str("[", ip, "]:", ntohs(raw_port)));
  }
  return forms;
}

// One connected TCP socket of this process: its descriptor and its (local,
// remote) addresses as Gloo prints them.
struct ConnectedSocket {
  int fd;
  std::vector<std::string> local;
  std::vector<std::string> remote;
};

std::vector<ConnectedSocket> connected_sockets() {
  std::vector<ConnectedSocket> sockets;
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) {
    return sockets;
  }
  while (const dirent* entry = ::readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(fds)) {
      continue;
    }
    sockaddr_storage local{};
    sockaddr_storage remote{};
    socklen_t local_size = sizeof(local);
    socklen_t remote_size = sizeof(remote);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_size) == 0 &&
        ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&remote), &remote_size) == 0) {
      sockets.push_back({static_cast<int>(fd), gloo_address_forms(local), gloo_address_forms(remote)});
    }
  }
  ::closedir(fds);
  return sockets;
}

// Reads the "<rank> <address>" lines that every other rank published under
// `key_prefix`<rank>, and keeps the addresses listed for `rank`.
std::vector<std::pair<std::string, int>> addresses_listed_for(ddp::Store& store, const std::string& key_prefix,
                                                               int rank, int size,
                                                               std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    keys.push_back(key_prefix + std::to_string(r));
  }
  store.wait(keys, timeout);
  std::vector<std::pair<std::string, int>> found;
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      continue;
    }
    std::istringstream lines(store.get_string(keys[r]));
    int to = -1;
    std::string address;
    while (lines >> to >> address) {
      if (to == rank) {
        found.emplace_back(address, r);
      }
    }
  }
  return found;
}

std::string object_holding(const void* address) {
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
    return "<unknown>";
  }
  return info.dli_fname;
}

} // namespace

std::vector<std::pair<std::string, int>> exchange_peer_addresses(
    gloo::Context& context, ddp::Store& store, const std::string& prefix, int rank, int size,
    std::chrono::milliseconds timeout) {
  // Round 1: the address of this rank's end of each pair.
  std::string pairs;
  for (int r = 0; r < size; ++r) {
    if (r != rank) {
      pairs += c10::str(r, " ", context.getPair(r)->address().str(), "\n");
    }
  }
  store.set(prefix + "pair_addresses/" + std::to_string(rank), pairs);
  auto peers = addresses_listed_for(store, prefix + "pair_addresses/", rank, size, timeout);

  // Round 2: the source address of each socket this rank opened towards
  // another rank's end of a pair.
  std::string sources;
  const auto sockets = connected_sockets();
  for (const auto& [address, r] : peers) {
    for (const auto& socket : sockets) {
      if (std::find(socket.remote.begin(), socket.remote.end(), address) != socket.remote.end()) {
        for (const auto& form : socket.local) {
          sources += c10::str(r, " ", form, "\n");
        }
      }
    }
  }
  store.set(prefix + "source_addresses/" + std::to_string(rank), sources);
  auto from = addresses_listed_for(store, prefix + "source_addresses/", rank, size, timeout);
  peers.insert(peers.end(), from.begin(), from.end());

  // And the address that each other rank's pair with this one had when Gloo
  // exchanged them (some Gloo versions keep naming the peer by it): Gloo's
  // connect stored, under the rank's number, the raw socket address of each
  // of its pairs with the others in rank order. Read only when the sizes
  // add up; a Gloo that stores something else is simply not used for names.
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      continue;
    }
    const auto bytes = store.get(prefix + "gloo/" + std::to_string(r));
    if (bytes.empty() || bytes.size() % static_cast<size_t>(size - 1) != 0) {
      continue;
    }
    const size_t blob = bytes.size() / static_cast<size_t>(size - 1);
    const size_t index = static_cast<size_t>(rank < r ? rank : rank - 1);
    if (blob < sizeof(sockaddr_storage)) {
      continue;
    }
    sockaddr_storage address{};
    std::memcpy(&address, bytes.data() + index * blob, sizeof(address));
    for (const auto& form : gloo_address_forms(address)) {
      peers.emplace_back(form, r);
    }
  }
  return peers;
}

std::vector<std::pair<int, int>> peer_sockets(const std::vector<std::pair<std::string, int>>& peer_addresses) {
  std::vector<std::pair<int, int>> found;
  for (const auto& socket : connected_sockets()) {
    const auto peer = std::find_if(peer_addresses.begin(), peer_addresses.end(), [&](const auto& p) {
      return std::find(socket.remote.begin(), socket.remote.end(), p.first) != socket.remote.end();
    });
    if (peer != peer_addresses.end()) {
      found.emplace_back(socket.fd, peer->second);
    }
  }
  return found;
}

int shut_down_connections(const std::vector<std::pair<std::string, int>>& peer_addresses) {
  int count = 0;
  for (const auto& [fd, rank] : peer_sockets(peer_addresses)) {
    if (::shutdown(fd, SHUT_RDWR) == 0) {
      ++count;
    }
  }
  return count;
}

GlooOrigin gloo_origin() {
  GlooOrigin origin;
  // Gloo versions differ in whether the options are const: take the
  // function's type as it is.
  const auto allreduce = &gloo::allreduce;
  origin.algorithms = object_holding(reinterpret_cast<const void*>(allreduce));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  internal::SigpipeGuard guard; // See Note [SIGPIPE and Gloo]
  const auto device = gloo::transport::tcp::CreateDevice(attr);
  // The first word of a polymorphic object is its vtable pointer.
  const void* vtable = *reinterpret_cast<const void* const*>(device.get());
  origin.transport = object_holding(vtable);
  return origin;
}

} // namespace ddp::internal
