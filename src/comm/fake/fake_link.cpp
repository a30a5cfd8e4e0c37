#include "comm/fake/fake_link.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "internal/check.h"
#include "internal/env.h"

namespace ddp::internal {

namespace {

// At most this many bytes, and at most this many ranks, Gloo's allreduce
// exchanges whole buffers instead of running its ring (as cost_model.py).
constexpr int64_t kExchangeMaxBytes = 64 * 1024;
constexpr int kExchangeMaxRanks = 8;

double parse_number(const std::string& who, const std::string& key, const std::string& value) {
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  DDP_CHECK(!value.empty() && *end == '\0' && std::isfinite(number) && number >= 0, who, kEnvFakeLink.name, ": ", key,
            " takes a number >= 0 (got '", value, "')");
  return number;
}

// A group's shape over the hosts (cost_model.py's group_shape).
struct Shape {
  int world = 0;     // the group's ranks
  int hosts = 0;     // hosts it spans
  int g = 0;         // its most ranks on one host
  int sharing = 1;   // groups like it sharing each host's link
  bool even = false; // the same number of its ranks on every host it spans
};

Shape shape_of(const std::vector<int>& members, int per_host) {
  std::map<int, int> hosts;
  for (const int rank : members) {
    hosts[rank / per_host] += 1;
  }
  Shape shape;
  shape.world = static_cast<int>(members.size());
  shape.hosts = static_cast<int>(hosts.size());
  int fewest = shape.world;
  for (const auto& entry : hosts) {
    shape.g = std::max(shape.g, entry.second);
    fewest = std::min(fewest, entry.second);
  }
  shape.even = fewest == shape.g;
  shape.sharing = std::max(1, per_host / std::max(1, shape.g));
  return shape;
}

bool is_op(const std::string& op, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* name) { return op == name; });
}

// Gloo's broadcast, a binomial tree, averaged over the group's ranks as the
// root (cost_model.py's binomial_rounds): in round i each rank holding the
// tensor sends it 2^i further, and a round costs a latency and k tensors
// over the link, k the most sends into or out of one host that cross it.
// The tree's shape depends on the group alone, so it is worked out once per
// group (ZeRO broadcasts on the same group W times a step).
struct TreeShape {
  double crossing_rounds = 0; // rounds that cross a link, per root
  double tensors = 0;         // the sum of those rounds' k, per root
  double crossing = 0;        // sends across a link, per root
  double local = 0;           // sends within a host, per root
};

TreeShape tree_shape_of(const std::vector<int>& members, int per_host) {
  const size_t size = members.size();
  size_t dim = 1;
  while ((size_t{1} << dim) < size) {
    ++dim;
  }
  TreeShape shape;
  for (size_t root = 0; root < size; ++root) {
    for (size_t i = 0; i < dim; ++i) {
      std::map<int, int> out;
      std::map<int, int> into;
      int most = 0;
      for (size_t v = 0; v < std::min(size_t{1} << i, size); ++v) {
        const size_t peer = v + (size_t{1} << i);
        if (peer >= size) {
          continue;
        }
        const int a = members[(v + root) % size] / per_host;
        const int b = members[(peer + root) % size] / per_host;
        if (a == b) {
          shape.local += 1;
          continue;
        }
        shape.crossing += 1;
        most = std::max({most, ++out[a], ++into[b]});
      }
      shape.crossing_rounds += most > 0 ? 1 : 0;
      shape.tensors += most;
    }
  }
  const auto roots = static_cast<double>(size);
  shape.crossing_rounds /= roots;
  shape.tensors /= roots;
  shape.crossing /= roots;
  shape.local /= roots;
  return shape;
}

TreeShape binomial_broadcast(const std::vector<int>& members, int per_host) {
  static std::mutex mutex;
  static std::map<std::pair<std::vector<int>, int>, TreeShape> shapes;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(members, per_host);
  auto found = shapes.find(key);
  if (found == shapes.end()) {
    found = shapes.emplace(std::move(key), tree_shape_of(members, per_host)).first;
  }
  return found->second;
}

// An allreduce Gloo reduces in shared memory within each host and among
// the hosts over their links (Note [Reduced among hosts]; cost_model.py's
// hierarchical): past the exchange's bytes, two or more ranks on every host.
bool hierarchical(const std::string& op, double n, const Shape& s) {
  return is_op(op, {"allreduce", "allreduce_coalesced"}) && n > kExchangeMaxBytes && s.hosts >= 2 && s.even &&
         s.g >= 2;
}

double seconds_on_link(const FakeLink& link, const std::string& op, double sent, double n, const Shape& s) {
  const double b = link.bandwidth / s.sharing;
  const double l = link.latency;
  const int w = s.world;
  if (hierarchical(op, n, s)) {
    return (s.hosts == 2 ? 1.0 : 2.0) * l + 2.0 * (s.hosts - 1) * n / (s.hosts * b);
  }
  if (is_op(op, {"allreduce", "allreduce_coalesced"})) {
    if (n <= kExchangeMaxBytes && w <= kExchangeMaxRanks) {
      return l + s.g * (w - s.g) * n / b;
    }
    return 2.0 * (w - 1) * l + sent / b;
  }
  if (is_op(op, {"allgather", "allgather_into_tensor"})) {
    return (w - 1) * l + sent / b;
  }
  if (is_op(op, {"reduce_scatter", "reduce_scatter_tensor"})) {
    return l + s.g * sent * (w - s.g) / ((w - 1) * b);
  }
  if (op == "barrier") {
    return 2.0 * std::ceil(std::log2(w)) * l;
  }
  return l + std::max(sent, n) / b;
}

// (bytes crossing host links, bytes between ranks of one host over TCP)
// moved by all the groups like this one (cost_model.py's call_bytes).
std::pair<double, double> bytes_moved(const std::string& op, double sent, double n, const Shape& s) {
  double total = 0;
  double crossing = 0;
  const int w = s.world;
  if (hierarchical(op, n, s)) {
    return {2.0 * (s.hosts - 1) * n, 0.0}; // within each host: shared memory
  }
  if (is_op(op, {"reduce_scatter", "reduce_scatter_tensor"}) ||
      (is_op(op, {"allreduce", "allreduce_coalesced"}) && n <= kExchangeMaxBytes && w <= kExchangeMaxRanks)) {
    total = w * std::max(sent, n);
    crossing = static_cast<double>(w - s.g) / (w - 1);
  } else {
    total = w * std::max(sent, n);
    crossing = static_cast<double>(s.hosts) / w;
  }
  return {total * crossing, total * (1 - crossing)};
}

double thread_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

} // namespace

std::optional<FakeLink> fake_link_from_env(const std::string& who_prefix) {
  const std::string who = who_prefix.empty() ? who_prefix : who_prefix + " ";
  const auto text = env_get(kEnvFakeLink);
  if (!text || text->empty()) {
    return std::nullopt;
  }
  FakeLink link;
  link.per_host = 0;
  bool has_bandwidth = false;
  bool has_latency = false;
  std::stringstream items(*text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto equals = item.find('=');
    DDP_CHECK(equals != std::string::npos, who, kEnvFakeLink.name, ": '", item, "' is not key=value (in '", *text, "')");
    const std::string key = item.substr(0, equals);
    const double value = parse_number(who, key, item.substr(equals + 1));
    if (key == "gbit") {
      DDP_CHECK(value > 0, who, kEnvFakeLink.name, ": gbit must be above 0");
      link.bandwidth = value * 1e9 / 8;
      has_bandwidth = true;
    } else if (key == "latency_us") {
      link.latency = value * 1e-6;
      has_latency = true;
    } else if (key == "per_host") {
      DDP_CHECK(value >= 1 && value == std::floor(value), who, kEnvFakeLink.name, ": per_host takes a whole number >= 1");
      link.per_host = static_cast<int>(value);
    } else if (key == "cpu_ns_link") {
      link.cpu_ns_link = value;
    } else if (key == "cpu_ns_loopback") {
      link.cpu_ns_loopback = value;
    } else {
      DDP_CHECK(false, who, kEnvFakeLink.name, ": unknown key '", key,
                "' (known: gbit, latency_us, per_host, cpu_ns_link, cpu_ns_loopback)");
    }
  }
  DDP_CHECK(has_bandwidth && has_latency, who, kEnvFakeLink.name, ": gbit and latency_us are required (got '", *text,
            "')");
  if (link.per_host == 0) {
    const auto local = env_get(kEnvLocalWorldSize);
    link.per_host = local ? std::max(1, std::atoi(local->c_str())) : 1;
  }
  return link;
}

FakeCost fake_call_cost(const FakeLink& link, const std::string& op, int64_t sent, int64_t n,
                        const std::vector<int>& members, int world) {
  const Shape shape = shape_of(members, link.per_host);
  FakeCost cost;
  if (shape.world <= 1 || shape.hosts <= 1) {
    return cost; // within one host: shared memory, taken as free
  }
  const auto s = static_cast<double>(sent);
  const auto bytes = static_cast<double>(n);
  double crossing = 0;
  double loopback = 0;
  if (op == "broadcast") {
    const TreeShape tree = binomial_broadcast(members, link.per_host);
    cost.network_s = tree.crossing_rounds * link.latency + tree.tensors * bytes * shape.sharing / link.bandwidth;
    crossing = tree.crossing * bytes;
    loopback = tree.local * bytes;
  } else {
    cost.network_s = seconds_on_link(link, op, s, bytes, shape);
    std::tie(crossing, loopback) = bytes_moved(op, s, bytes, shape);
  }
  const double instances = static_cast<double>(world) / shape.world;
  cost.cpu_s = (crossing * link.cpu_ns_link + loopback * link.cpu_ns_loopback) * 1e-9 * instances / world;
  return cost;
}

FakeWire::FakeWire() : queue_(std::make_shared<Queue>()) {
  thread_ = std::thread([queue = queue_] { run(queue); });
}

FakeWire::~FakeWire() {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->wake.notify_all();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach(); // the last owner let go in a callback on this thread
  } else {
    thread_.join();
  }
}

void FakeWire::submit(std::shared_ptr<Work> work, std::vector<at::Tensor> result, FakeCost cost) {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->items.push_back({std::move(work), std::move(result), cost});
  }
  queue_->wake.notify_all();
}

void FakeWire::run(const std::shared_ptr<Queue>& queue) {
  std::unique_lock<std::mutex> lock(queue->mutex);
  for (;;) {
    queue->wake.wait(lock, [&] { return queue->stop || !queue->items.empty(); });
    if (queue->items.empty()) {
      return; // stopped
    }
    Item item = std::move(queue->items.front());
    queue->items.pop_front();
    if (!queue->stop) {
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      const double cpu_end = thread_cpu_seconds() + item.cost.cpu_s;
      while (!queue->stop && thread_cpu_seconds() < cpu_end) {
        // The bytes' CPU work: spin, competing for the cores.
      }
      lock.lock();
      // The rest of the network time; a stop (the group going) ends it.
      queue->wake.wait_until(lock,
                             start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                         std::chrono::duration<double>(item.cost.network_s)),
                             [&] { return queue->stop.load(); });
    }
    lock.unlock();
    item.work->set_result(std::move(item.result));
    item.work.reset();
    lock.lock();
  }
}

} // namespace ddp::internal
