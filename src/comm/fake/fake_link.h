#pragma once

// A simulated link for the fake backend (private header): each operation's
// Work completes after the time the cost model prices it at, instead of at
// once, so that a fake run's step time is the step time the model predicts,
// overlap and waits included. See Note [A simulated link].

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/work.h>

namespace ddp::internal {

// Note [A simulated link]
// The cost model (bench/scaling/cost_model.py, docs/scaling.md) prices a
// step as compute plus each collective's time, with no overlap: what DDP's
// buckets hide behind backward, or FSDP's prefetch behind forward, it
// cannot see. With DDP_FAKE_LINK set, the fake backend plays the link
// instead of pricing it. Each group has one thread, as a real group's
// worker; operations queue on it in issue order; each takes
//   - its network time, priced as the model prices it (the ring, exchange
//     and tree formulas over H hosts of G ranks, links of bandwidth B and
//     one-way latency L, the groups alike sharing a host's link), and
//   - this rank's share of the CPU that the bytes cost on a simulated
//     cluster (ns per byte through the switch and through loopback, as
//     link_probe.py measures them), spent by the thread spinning,
// the longer of the two, since the CPU work runs while the bytes travel.
// The Work completes then (its callbacks run on that thread, as on a real
// worker). So the program's own waits decide what overlaps: DDP's reducer
// waits for its buckets only after backward, FSDP for a unit's gather
// before the unit's forward. And with every rank of the job running at once
// on the machine, as on the simulated cluster, the spinning threads compete
// with the compute for the cores as the real transfers do.
//
// DDP_FAKE_LINK is a list of key=value pairs separated by commas:
//   gbit=B           each host link's bandwidth, Gbit/s (required)
//   latency_us=L     one-way latency between hosts, us (required)
//   per_host=G       ranks per host (default LOCAL_WORLD_SIZE, else 1)
//   cpu_ns_link=X    the machine's CPU ns per byte that crosses a host link
//   cpu_ns_loopback=Y  ... per byte between two ranks of one host over TCP
//                    (both default 0: no CPU cost; the threads of all the
//                    job's ranks share the machine's cores as they spin)
// A malformed value is an error naming the key, at the group's creation.

struct FakeLink {
  double bandwidth = 0;   // bytes/s, each way
  double latency = 0;     // s, one way
  int per_host = 1;
  double cpu_ns_link = 0;
  double cpu_ns_loopback = 0;
};

// DDP_FAKE_LINK, parsed; nullopt when unset or empty. Throws on a malformed
// value, naming it, after `who` ("[rank 1/4] fake group").
std::optional<FakeLink> fake_link_from_env(const std::string& who = "");

// What one operation costs on `link`: `sent` the bytes this rank sends (as
// the plan counts them), `n` its tensor's bytes, `members` its group's world
// ranks, `world` the world's size.
struct FakeCost {
  double network_s = 0; // the link's time
  double cpu_s = 0;     // this rank's share of the machine's CPU time
};
FakeCost fake_call_cost(const FakeLink& link, const std::string& op, int64_t sent, int64_t n,
                        const std::vector<int>& members, int world);

// The thread that completes a group's operations after their cost.
class FakeWire {
 public:
  FakeWire();
  ~FakeWire(); // completes what is queued (and the one under way) at once, then joins

  FakeWire(const FakeWire&) = delete;
  FakeWire& operator=(const FakeWire&) = delete;

  // Completes `work` with `result` once the operations queued before it and
  // `cost` have passed.
  void submit(std::shared_ptr<Work> work, std::vector<at::Tensor> result, FakeCost cost);

 private:
  struct Item {
    std::shared_ptr<Work> work;
    std::vector<at::Tensor> result;
    FakeCost cost;
  };
  // Shared with the thread, which may outlive this object when the last
  // owner of the group lets go in a callback that runs on it.
  struct Queue {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<Item> items;         // guarded by mutex
    std::atomic<bool> stop{false};  // set under mutex; read while spinning too
  };
  static void run(const std::shared_ptr<Queue>& queue);

  std::shared_ptr<Queue> queue_;
  std::thread thread_;
};

} // namespace ddp::internal
