#pragma once

// How ranks of a Gloo group find each other (private header).
//
// 1. Arrival (comm/rendezvous_arrival.h, which NCCL's engine shares).
// 2. Gloo's full-mesh connect runs over the same Store through
//    `GlooStoreAdapter`, with the group's deadline on every wait.
// 3. The TCP device binds to the interface chosen by `make_gloo_device`.
// 4. The ranks learn each other's socket addresses (exchange_peer_addresses).

#include "comm/gloo/gloo_api.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/store/store.h>

namespace ddp::internal {

// Presents a ddp::Store, with every key under `prefix`, as Gloo's store.
class DDP_GLOO_HIDDEN GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<ddp::Store> store, std::string prefix,
                   std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;

  std::shared_ptr<ddp::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

struct DeviceChoice {
  std::string interface; // bind to this interface, or
  std::string hostname;  // to this address when interface is empty
  std::string reason;    // why, for error messages
};

// Picks where to bind: explicit interface, DDP_SOCKET_IFNAME /
// GLOO_SOCKET_IFNAME, explicit hostname, the local address of the route to
// `master_addr`, this host's name, loopback (in that order).
DeviceChoice choose_device(const std::string& interface, const std::string& hostname,
                           const std::string& master_addr, int size);

std::shared_ptr<gloo::transport::Device> make_gloo_device(const DeviceChoice& choice,
                                                          const std::string& who);

// Step 4, after Gloo's connect: learns the socket addresses by which this
// rank's Gloo errors may name each other rank, so that "connection closed
// by peer [127.0.0.1]:4242" becomes "lost connection to rank 2". Gloo names
// a pair's peer by an address it keeps in a protected member, which Gloo
// versions set differently: the address the peer's pair had when Gloo
// exchanged them (read back from Gloo's own keys in the store), the peer's
// end of the connected socket once connected, or, where the peer opened the
// connection, the peer's ephemeral source address. So every rank publishes
// the address of each of its pairs, and the source address of each socket
// that it opened towards another rank, found among this process's sockets.
// Two store rounds, which also keep every rank in rendezvous until all are
// connected (a rank that destroyed its group at once would otherwise close
// connections a slower peer is still setting up, as PyTorch's store-based
// barrier prevents too). Returns (address, rank) pairs, each address in both
// of the ways Gloo versions print a port.
std::vector<std::pair<std::string, int>> exchange_peer_addresses(
    gloo::Context& context, ddp::Store& store, const std::string& prefix, int rank, int size,
    std::chrono::milliseconds timeout);

// This process's connected TCP sockets to the addresses of `peer_addresses`
// (as exchange_peer_addresses returned them): (descriptor, peer's rank).
std::vector<std::pair<int, int>> peer_sockets(const std::vector<std::pair<std::string, int>>& peer_addresses);

// Shuts down (both directions) this process's TCP connections to the
// addresses of `peer_addresses` (as exchange_peer_addresses returned them):
// every Gloo operation of the group still waiting on them then fails at once.
// The group is unusable afterwards. Returns how many were shut down.
int shut_down_connections(const std::vector<std::pair<std::string, int>>& peer_addresses);

} // namespace ddp::internal
