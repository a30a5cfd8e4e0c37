#include "comm/shm/shared_buffers.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <optional>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "comm/reduce_targets.h"
#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"
#include "plan/memory_counter.h"

namespace ddp::internal::shm {

struct SharedMapping {
  int64_t id = -1;
  size_t bytes = 0;
  // bases[r]: rank r's object as mapped here; nullptr off this host. A
  // common buffer (allocate_common) has one object, bases[0].
  std::vector<uint8_t*> bases;
  bool common = false;

  SharedMapping() = default;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping() {
    for (uint8_t* base : bases) {
      if (base != nullptr) {
        munmap(base, bytes);
      }
    }
  }
};

// This rank's buffers, by the address of its own object. The tensors'
// deleters remove theirs from any thread.
struct SharedBuffers::Registry {
  mutable std::mutex mutex;
  std::map<const uint8_t*, std::shared_ptr<const SharedMapping>> by_base; // guarded by mutex
};

void Coordinator::reduce_among(void*, size_t, size_t, const std::vector<int>&, const ReduceKernel&) {
  DDP_CHECK(false, "this transport cannot reduce among a subset of ranks");
}

namespace {

// The piece of its share that a rank reduces, divides and copies to its
// peers before it goes on to the next: well inside a core's L2 cache.
constexpr int64_t kPieceBytes = 256 * 1024;

// `rank` -1: a common buffer's one object.
std::string object_name(uint64_t key, int rank, int64_t id) {
  char name[64];
  if (rank < 0) {
    std::snprintf(name, sizeof(name), "/ddp-%016llx-common-%lld", static_cast<unsigned long long>(key),
                  static_cast<long long>(id));
  } else {
    std::snprintf(name, sizeof(name), "/ddp-%016llx-%d-%lld", static_cast<unsigned long long>(key), rank,
                  static_cast<long long>(id));
  }
  return name;
}

// What /dev/shm can still take, for messages.
std::string shm_room() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0) {
    return "";
  }
  const double mib = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) / (1 << 20);
  return c10::str(" (/dev/shm has ", static_cast<int64_t>(mib), " MiB free; a container's default is 64 MiB: "
                  "docker run --shm-size raises it)");
}

// Creates, sizes and maps this rank's object; on failure returns nullptr
// and says why in `why` (the object is then gone).
uint8_t* create_own(const std::string& name, size_t bytes, std::string& why) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    why = c10::str("shm_open(", name, "): ", std::strerror(errno));
    return nullptr;
  }
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    why = c10::str("ftruncate(", name, ", ", bytes, "): ", std::strerror(errno));
  } else if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    why = c10::str("reserving ", bytes, " bytes for ", name, " in /dev/shm: ", std::strerror(error),
                   shm_room());
  } else {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      why = c10::str("mmap(", name, "): ", std::strerror(errno));
    }
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  return static_cast<uint8_t*>(base);
}

// Maps a peer's object, which must be `bytes` long; nullptr on failure.
uint8_t* map_peer(const std::string& name, size_t bytes, std::string& why) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    why = c10::str("shm_open(", name, ") of a peer: ", std::strerror(errno));
    return nullptr;
  }
  struct stat status {};
  void* base = MAP_FAILED;
  if (fstat(fd, &status) != 0 || static_cast<size_t>(status.st_size) != bytes) {
    why = c10::str("a peer's ", name, " is not ", bytes, " bytes long");
  } else {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      why = c10::str("mmap(", name, ") of a peer: ", std::strerror(errno));
    }
  }
  close(fd);
  return base == MAP_FAILED ? nullptr : static_cast<uint8_t*>(base);
}

// Whether `ok` holds on every rank.
bool all_ranks(Coordinator& coordinator, bool ok) {
  int64_t failed = ok ? 0 : 1;
  coordinator.max(&failed, 1);
  return failed == 0;
}

// This process's host, as Note [Shared buffers] defines it: a hash in
// [0, 2^63).
int64_t host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat shm {};
  struct stat net {};
  stat("/dev/shm", &shm);
  stat("/proc/self/ns/net", &net);
  const std::string text =
      c10::str(boot, '/', shm.st_dev, '/', shm.st_ino, '/', net.st_dev, '/', net.st_ino);
  return static_cast<int64_t>(std::hash<std::string>{}(text) >> 1);
}


} // namespace

void test_kill_point(const char* point, int rank) {
  // Read each time: a forked test rank sets it after its parent has run.
  const std::optional<std::string> chosen = env_get(kEnvTestShmKillAt);
  if (chosen && *chosen == std::string(point) + ":" + std::to_string(rank)) {
    std::fflush(nullptr);
    raise(SIGKILL);
  }
}

// Gloo's ring allreduce (gloo/allreduce.cc, the Gloo that ddp builds on:
// Debian's of 2022 and the commit cmake/gloo.cmake pins) cuts `total` bytes
// into segments, a whole number of them per rank, at most `max_segment`
// bytes each (rounded to elements) and at least two per rank; chunk c, the
// one that rank c finishes, is the bytes [c * chunk, (c + 1) * chunk) that
// lie below `total`. Returns `chunk`.
size_t ring_chunk_bytes(size_t total, size_t element, int size, size_t max_segment) {
  const auto round_up = [](size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; };
  const auto n = static_cast<size_t>(size);
  const size_t max_segment_bytes = element * std::max<size_t>(1, max_segment / element);
  const size_t segments = round_up(std::max((total + max_segment_bytes - 1) / max_segment_bytes, n * 2), n);
  const size_t segment = round_up((total + segments - 1) / segments, element);
  return segments / n * segment;
}

SharedBuffers::SharedBuffers(std::string who, std::string backend, int rank, int size)
    : who_(std::move(who)),
      backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      registry_(std::make_shared<Registry>()) {}

SharedBuffers::~SharedBuffers() = default;

void SharedBuffers::learn_hosts(Coordinator& coordinator) {
  hosts_known_ = true;
  // Slot r: rank r's host; the last slot: rank 0's key. -1 where unknown.
  std::vector<int64_t> values(static_cast<size_t>(size_) + 1, -1);
  values[rank_] = host_identity();
  if (rank_ == 0) {
    std::random_device random;
    const uint64_t key = (static_cast<uint64_t>(random()) << 32) ^ random() ^
                         (static_cast<uint64_t>(getpid()) << 16);
    values[size_] = static_cast<int64_t>(key >> 1);
  }
  coordinator.max(values.data(), values.size());
  key_ = static_cast<uint64_t>(values[size_]);
  // Hosts in the order of their lowest rank.
  std::vector<int64_t> hosts;
  std::map<int64_t, std::vector<int>> ranks_of;
  for (int r = 0; r < size_; ++r) {
    if (ranks_of.count(values[r]) == 0) {
      hosts.push_back(values[r]);
    }
    ranks_of[values[r]].push_back(r);
  }
  local_ = ranks_of[values[rank_]];
  if (hosts.size() == 1) {
    sharing_ = true;
    probe_cross_memory(coordinator);
    return;
  }
  const size_t per_host = local_.size();
  bool even = per_host >= 2;
  for (const int64_t host : hosts) {
    even = even && ranks_of[host].size() == per_host;
  }
  sharing_ = even && coordinator.can_reduce_among();
  if (sharing_) {
    const auto j = static_cast<size_t>(std::find(local_.begin(), local_.end(), rank_) - local_.begin());
    for (const int64_t host : hosts) {
      column_.push_back(ranks_of[host][j]);
    }
    std::sort(column_.begin(), column_.end());
  }
}

at::Tensor SharedBuffers::allocate(Coordinator& coordinator, int64_t numel, const at::TensorOptions& options,
                                   bool wanted, bool common) {
  if (!hosts_known_) {
    learn_hosts(coordinator);
  }
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  if (!sharing_ || bytes == 0 || (common && multi_host())) {
    return {};
  }
  // Every rank goes on, so that a rank that does not want the buffer (its
  // options or environment differ) makes the others give up too.
  if (!all_ranks(coordinator, wanted)) {
    return {};
  }
  const int64_t id = next_id_++;
  auto mapping = std::make_shared<SharedMapping>();
  mapping->id = id;
  mapping->bytes = bytes;
  mapping->common = common;
  mapping->bases.assign(common ? 1 : static_cast<size_t>(size_), nullptr);
  // Per rank: each rank creates its object and maps its peers'. Common: the
  // host's first rank creates the one object, the others map it.
  const bool creates = !common || rank_ == local_.front();
  const std::string own_name = object_name(key_, common ? -1 : rank_, id);
  uint8_t*& own = mapping->bases[common ? 0 : static_cast<size_t>(rank_)];
  // A peer may create its object and die before unlinking it: whoever
  // gives up unlinks every name of the allocation.
  const auto unlink_all = [&] {
    if (common) {
      shm_unlink(own_name.c_str());
      return;
    }
    for (const int r : local_) {
      shm_unlink(object_name(key_, r, id).c_str());
    }
  };
  std::string why;
  bool ok = false;
  try {
    if (creates) {
      own = create_own(own_name, bytes, why);
    }
    test_kill_point("created", rank_);
    ok = all_ranks(coordinator, !creates || own != nullptr);
    if (ok) {
      if (common) {
        if (!creates) {
          own = map_peer(own_name, bytes, why);
        }
      } else {
        for (const int r : local_) {
          if (r != rank_ && why.empty()) {
            mapping->bases[r] = map_peer(object_name(key_, r, id), bytes, why);
          }
        }
      }
      ok = all_ranks(coordinator, why.empty());
    }
  } catch (...) {
    unlink_all();
    throw;
  }
  // Every rank has mapped every object it could: the names are no longer
  // needed, and the memory goes when the last mapping does. Every rank
  // unlinks every name (a name already gone is no error), so that a rank
  // killed here leaves nothing behind.
  unlink_all();
  if (!ok) {
    // `mapping`'s destructor unmaps what was mapped.
    if (!warned_) {
      warned_ = true;
      log_warning(c10::str(who_, " ", backend_, ": buffers in shared memory are not available",
                           why.empty() ? std::string(" (another rank failed)") : ": " + why,
                           "; DDP's buckets use private memory and the collectives send messages"));
    }
    return {};
  }
  ++allocated_;
  // A common buffer is the host's ranks' together: each counts its part.
  const size_t own_bytes = common ? bytes / local_.size() : bytes;
  allocated_bytes_ += static_cast<int64_t>(own_bytes);
  uint8_t* base = own;
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    registry_->by_base.emplace(base, std::move(mapping));
  }
  // The deleter may run on any thread, after the group is gone.
  std::shared_ptr<Registry> registry = registry_;
  // This rank's object is a tensor's memory as much as an allocated one:
  // the plan's tensor memory counts it (Note [Counting tensor memory]).
  const bool counted = count_tensor_bytes_outside_allocator(static_cast<int64_t>(own_bytes));
  return at::from_blob(
      base, {numel},
      [registry, counted, own_bytes](void* data) {
        if (counted) {
          count_tensor_bytes_outside_allocator(-static_cast<int64_t>(own_bytes));
        }
        std::shared_ptr<const SharedMapping> released;
        std::lock_guard<std::mutex> lock(registry->mutex);
        auto it = registry->by_base.find(static_cast<const uint8_t*>(data));
        if (it != registry->by_base.end()) {
          released = std::move(it->second); // unmapped once the last user lets go
          registry->by_base.erase(it);
        }
      },
      options.device(at::kCPU));
}

SharedStats SharedBuffers::stats() const {
  SharedStats stats;
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    stats.buffers = static_cast<int64_t>(registry_->by_base.size());
  }
  stats.bytes = allocated_bytes_;
  stats.allreduces = allreduces_;
  stats.allgathers = allgathers_;
  stats.direct = direct_;
  stats.reduce_scatters = reduce_scatters_;
  return stats;
}

SharedLocation SharedBuffers::locate(const at::Tensor& tensor) const {
  SharedLocation where;
  if (!tensor.is_cpu() || !tensor.is_contiguous() || tensor.numel() == 0) {
    return where;
  }
  const auto* data = static_cast<const uint8_t*>(tensor.data_ptr());
  const size_t bytes = tensor.nbytes();
  std::lock_guard<std::mutex> lock(registry_->mutex);
  auto it = registry_->by_base.upper_bound(data);
  if (it == registry_->by_base.begin()) {
    return where;
  }
  --it;
  const auto& mapping = it->second;
  const size_t offset = static_cast<size_t>(data - it->first);
  // A common buffer is the same memory on every rank: no collective reads
  // peers in it (the callers' ranges would overlap).
  if (!mapping->common && offset + bytes <= mapping->bytes) {
    where.id = mapping->id;
    where.offset = static_cast<int64_t>(offset);
    where.mapping = mapping;
  }
  return where;
}

SharedLocation SharedBuffers::locate_gather_input(const at::Tensor& input, const at::Tensor& output) const {
  const size_t bytes = input.nbytes();
  const auto* in = static_cast<const uint8_t*>(input.data_ptr());
  const auto* out = static_cast<const uint8_t*>(output.data_ptr());
  const bool apart = in + bytes <= out || out + output.nbytes() <= in ||
                     in == out + static_cast<size_t>(rank_) * bytes;
  return output.is_cpu() && apart ? locate(input) : SharedLocation{};
}

SharedLocation SharedBuffers::locate_scatter_inputs(const std::vector<at::Tensor>& inputs,
                                                    const at::Tensor& output) const {
  if (inputs.size() != static_cast<size_t>(size_) || !output.is_cpu() || !output.is_contiguous() ||
      output.numel() == 0) {
    return {};
  }
  const size_t part = output.nbytes();
  const auto* first = static_cast<const uint8_t*>(inputs.front().data_ptr());
  for (int r = 0; r < size_; ++r) {
    const auto& input = inputs[r];
    if (!input.is_cpu() || !input.is_contiguous() || input.nbytes() != part ||
        input.scalar_type() != output.scalar_type() ||
        static_cast<const uint8_t*>(input.data_ptr()) != first + static_cast<size_t>(r) * part) {
      return {};
    }
  }
  const auto* out = static_cast<const uint8_t*>(output.data_ptr());
  const size_t total = part * static_cast<size_t>(size_);
  const bool apart = out + part <= first || first + total <= out || out == first + static_cast<size_t>(rank_) * part;
  if (!apart) {
    return {};
  }
  // The whole range must lie in one buffer: locate the first part, then
  // check that the last ends within the same mapping.
  SharedLocation where = locate(inputs.front());
  if (where.id < 0 || static_cast<size_t>(where.offset) + total > where.mapping->bytes) {
    return {};
  }
  return where;
}

bool SharedBuffers::agree(Coordinator& coordinator, const SharedLocation& where, int64_t bytes, int64_t direct,
                          bool* direct_agreed, bool* any_gradients) const {
  // (v, -v) under MAX: every rank learns the largest and the smallest v.
  int64_t values[8] = {where.id, where.offset, bytes, direct, -where.id, -where.offset, -bytes, -direct};
  coordinator.max(values, 8);
  if (direct_agreed != nullptr) {
    *direct_agreed = values[3] >= 0 && values[3] == -values[7];
  }
  if (any_gradients != nullptr) {
    *any_gradients = values[3] != -1; // the largest offer: some rank passed gradients
  }
  return values[0] >= 0 && values[0] == -values[4] && values[1] == -values[5] &&
         values[2] == -values[6];
}

// Note [Reduced into targets]
// ProcessGroup::reduce_gradients, when it goes through the buffer (Note
// [Gradients read where they lie] could not take it), wants the result in
// the gradients besides the buffer. Reducing in place and copying the
// buffer into them afterwards would write this rank's share into the
// buffer and read it back from memory. Instead each piece of the share is
// reduced into a scratch piece that stays in cache, copied from there into
// the peers' buffers, into the targets, and into this rank's own buffer only
// where no target covers it. After the closing barrier the peers' shares,
// which they wrote into this rank's buffer, are copied into the targets.
// The buffer then holds the result outside the targets, as reduce_gradients
// promises, and the bits are those of the plain allreduce: each kernel call
// has the same operands in the same places, only its output is elsewhere.
// The multi-host form reduces in place and copies afterwards.

void SharedBuffers::allreduce(Coordinator& coordinator, const at::Tensor& flat, const SharedLocation& where,
                              const ReduceKernel& kernel, bool average, ReduceOrder order,
                              const std::vector<ReduceTarget>* targets) const {
  // `agree` was the first barrier: every rank's buffer holds its input.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ++allreduces_;
  test_kill_point("agreed", rank_);
  std::pair<int64_t, int64_t> done{0, 0}; // the range already in the targets
  if (multi_host()) {
    reduce_multi_host(coordinator, where, flat.numel(), flat.element_size(), kernel, average, flat);
  } else {
    done = reduce_one_host(where, flat.numel(), flat.element_size(), kernel, average, flat, order, targets);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  coordinator.barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (targets != nullptr && !targets->empty()) {
    const auto* own = static_cast<const uint8_t*>(flat.data_ptr());
    const size_t element = flat.element_size();
    copy_to_targets(own, 0, done.first, element, *targets, nullptr);
    copy_to_targets(own + static_cast<size_t>(done.second) * element, done.second, flat.numel(), element,
                    *targets, nullptr);
  }
}

std::pair<int64_t, int64_t> SharedBuffers::reduce_one_host(const SharedLocation& where, int64_t count,
                                                           size_t element, const ReduceKernel& kernel,
                                                           bool average, const at::Tensor& flat, ReduceOrder order,
                                                           const std::vector<ReduceTarget>* targets) const {
  int64_t begin = 0;
  int64_t length = 0;
  if (order == ReduceOrder::kGlooRing) {
    const size_t chunk = ring_chunk_bytes(static_cast<size_t>(count) * element, element, size_,
                                          kGlooMaxSegmentBytes) / element;
    begin = std::min<int64_t>(count, static_cast<int64_t>(chunk) * rank_);
    length = std::min<int64_t>(count, static_cast<int64_t>(chunk) * (rank_ + 1)) - begin;
  } else {
    const int64_t per = (count + size_ - 1) / size_;
    begin = std::min(count, per * rank_);
    length = std::min(count, per * (rank_ + 1)) - begin;
  }
  const auto at = [&](int r) {
    return where.mapping->bases[r] + where.offset + static_cast<size_t>(begin) * element;
  };
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(element));
  const bool into = targets != nullptr && !targets->empty(); // Note [Reduced into targets]
  thread_local std::vector<uint8_t> scratch;
  thread_local std::vector<uint8_t> result;
  if (order == ReduceOrder::kGlooRing && size_ > 2) {
    scratch.resize(static_cast<size_t>(piece) * element);
  }
  if (into) {
    result.resize(static_cast<size_t>(piece) * element);
  }
  for (int64_t done = 0; done < length; done += piece) {
    const int64_t n = std::min(piece, length - done);
    const size_t skip = static_cast<size_t>(done) * element;
    const auto count_n = static_cast<size_t>(n);
    uint8_t* own = at(rank_) + skip;
    uint8_t* out = into ? result.data() : own;
    if (order == ReduceOrder::kOwnFirst) {
      const uint8_t* sum = own;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) {
          kernel(out, sum, at(r) + skip, count_n);
          sum = out;
        }
      }
    } else if (size_ == 2) {
      kernel(out, own, at(1 - rank_) + skip, count_n);
    } else {
      // x_c + (x_{c+1} + (... + (x_{c-2} + x_{c-1}))), c = this rank.
      const auto peer = [&](int k) { return at((rank_ + k) % size_) + skip; };
      uint8_t* partial = scratch.data();
      kernel(partial, peer(size_ - 2), peer(size_ - 1), count_n);
      for (int k = size_ - 3; k >= 1; --k) {
        kernel(partial, peer(k), partial, count_n);
      }
      kernel(out, own, partial, count_n);
    }
    if (average) {
      if (into) {
        at::from_blob(out, {n}, flat.options()).div_(size_);
      } else {
        flat.narrow(0, begin + done, n).div_(size_);
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) {
        std::memcpy(at(r) + skip, out, count_n * element);
      }
    }
    if (into) {
      copy_to_targets(out, begin + done, begin + done + n, element, *targets, own);
    }
  }
  return {begin, begin + length};
}

void SharedBuffers::reduce_multi_host(Coordinator& coordinator, const SharedLocation& where, int64_t count,
                                      size_t element, const ReduceKernel& kernel, bool average,
                                      const at::Tensor& flat) const {
  const auto m = static_cast<int64_t>(local_.size());
  const auto j = std::find(local_.begin(), local_.end(), rank_) - local_.begin();
  const int64_t per = (count + m - 1) / m;
  const int64_t begin = std::min(count, per * j);
  const int64_t length = std::min(count, per * (j + 1)) - begin;
  if (length == 0) {
    // Every rank of the column has an empty part too; none calls the transport.
    return;
  }
  const auto at = [&](int r) {
    return where.mapping->bases[r] + where.offset + static_cast<size_t>(begin) * element;
  };
  uint8_t* own = at(rank_);
  const auto n = static_cast<size_t>(length);
  for (const int r : local_) {
    if (r != rank_) {
      kernel(own, own, at(r), n);
    }
  }
  coordinator.reduce_among(own, n, n * element, column_, kernel);
  if (average) {
    flat.narrow(0, begin, length).div_(size_);
  }
  for (const int r : local_) {
    if (r != rank_) {
      std::memcpy(at(r), own, n * element);
    }
  }
}

void SharedBuffers::allgather(Coordinator& coordinator, const at::Tensor& output, const SharedLocation& where,
                              int64_t bytes) const {
  // `agree` was the first barrier: every rank's input is written.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ++allgathers_;
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  for (int i = 0; i < size_; ++i) {
    const int r = (rank_ + i) % size_; // each reader starts at a different peer
    const uint8_t* from = where.mapping->bases[r] + where.offset;
    uint8_t* to = out + static_cast<size_t>(r) * static_cast<size_t>(bytes);
    if (from != to) {
      std::memmove(to, from, static_cast<size_t>(bytes));
    }
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  coordinator.barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void SharedBuffers::reduce_scatter(Coordinator& coordinator, const at::Tensor& output, const SharedLocation& where,
                                   const ReduceKernel& kernel, bool average) const {
  // `agree` was the first barrier: every rank's inputs are written.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ++reduce_scatters_;
  test_kill_point("scatter", rank_);
  const size_t element = output.element_size();
  const int64_t count = output.numel();
  const auto part = [&](int r) {
    return where.mapping->bases[r] + where.offset + static_cast<size_t>(rank_) * static_cast<size_t>(count) * element;
  };
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(element));
  for (int64_t done = 0; done < count; done += piece) {
    const auto n = static_cast<size_t>(std::min(piece, count - done));
    const size_t skip = static_cast<size_t>(done) * element;
    const uint8_t* sum = part(rank_) + skip; // `out` itself when reduced in place
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) {
        kernel(out + skip, sum, part(r) + skip, n);
        sum = out + skip;
      }
    }
  }
  if (average) {
    output.div_(size_);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  coordinator.barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

} // namespace ddp::internal::shm
