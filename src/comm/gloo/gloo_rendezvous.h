#pragma once

// How ranks of a Gloo group find each other (private header).
//
// 1. Arrival: each rank claims its rank number with `add` (so that two
//    processes started with the same RANK are caught), publishes its world
//    size under "<prefix>arrived/<rank>", and waits for every other rank's
//    key. A timeout names the ranks that never arrived; a world size that
//    differs names the rank that disagrees.
// 2. Gloo's full-mesh connect runs over the same Store through
//    `GlooStoreAdapter`, with the group's deadline on every wait.
// 3. The TCP device binds to the interface chosen by `make_gloo_device`.

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

// Step 1 above. `who` is the "[rank R/W]" prefix for messages.
void wait_for_all_ranks(ddp::Store& store, const std::string& prefix, int rank,
                        int size, std::chrono::milliseconds timeout, const std::string& who);

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

} // namespace ddp::internal
