#include "comm/gloo/gloo_rendezvous.h"

#include <dlfcn.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <ddp/comm/error.h>

#include "comm/gloo/gloo_origin.h"
#include "internal/check.h"
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
std::string format_ranks(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text + "]";
}
} // namespace

void wait_for_all_ranks(ddp::Store& store, const std::string& prefix, int rank, int size,
                        std::chrono::milliseconds timeout, const std::string& who) {
  const int64_t claims = store.add(prefix + "claim/" + std::to_string(rank), 1);
  DDP_CHECK(claims == 1, who, " init_process_group: rank ", rank,
            " was claimed by ", claims, " processes; each process needs its own RANK in [0, ",
            size, ")");
  store.set(prefix + "arrived/" + std::to_string(rank), std::to_string(size));

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    keys.push_back(prefix + "arrived/" + std::to_string(r));
  }
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) {
        missing.push_back(r);
      }
    }
    throw TimeoutError(c10::str(
        who, " init_process_group: rendezvous timed out after ", timeout.count(),
        " ms; rank(s) ", format_ranks(missing), " of ", size,
        " never arrived. Check that every rank was started with the same MASTER_ADDR, "
        "MASTER_PORT and WORLD_SIZE, and that none of them failed before joining."));
  }
  for (int r = 0; r < size; ++r) {
    const auto value = store.get(keys[r]);
    const std::string their_size(value.begin(), value.end());
    DDP_CHECK(their_size == std::to_string(size), who, " init_process_group: rank ", r,
              " was started with world size ", their_size, ", this rank with ", size,
              "; every rank needs the same WORLD_SIZE");
  }
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
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw IoError(c10::str(
        who, " init_process_group: cannot create Gloo's TCP device on ",
        choice.interface.empty() ? "address '" + choice.hostname + "'"
                                 : "interface '" + choice.interface + "'",
        " (chosen from ", choice.reason, "): ", e.what(),
        ". Set DDP_SOCKET_IFNAME to an interface that reaches the other ranks."));
  }
}

} // namespace ddp::internal

namespace ddp::internal {

namespace {

std::string object_holding(const void* address) {
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr) {
    return "<unknown>";
  }
  return info.dli_fname;
}

} // namespace

GlooOrigin gloo_origin() {
  GlooOrigin origin;
  // Gloo versions differ in whether the options are const: take the
  // function's type as it is.
  const auto allreduce = &gloo::allreduce;
  origin.algorithms = object_holding(reinterpret_cast<const void*>(allreduce));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  const auto device = gloo::transport::tcp::CreateDevice(attr);
  // The first word of a polymorphic object is its vtable pointer.
  const void* vtable = *reinterpret_cast<const void* const*>(device.get());
  origin.transport = object_holding(vtable);
  return origin;
}

} // namespace ddp::internal
