#include "comm/mpi/mpi_shared_buffers.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "comm/mpi/mpi_engine.h"
#include "comm/mpi/mpi_runtime.h"
#include "internal/logging.h"

namespace ddp::internal::mpi {

struct SharedMapping {
  int64_t id = -1;
  size_t bytes = 0;
  std::vector<uint8_t*> bases; // bases[r]: rank r's object as mapped here

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

namespace {

// The piece of its segment that a rank reduces, divides and copies to its
// peers before it goes on to the next: well inside a core's L2 cache.
constexpr int64_t kChunkBytes = 256 * 1024;

std::string object_name(uint64_t key, int rank, int64_t id) {
  char name[64];
  std::snprintf(name, sizeof(name), "/ddp-%016llx-%d-%lld", static_cast<unsigned long long>(key),
                rank, static_cast<long long>(id));
  return name;
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
    why = c10::str("reserving ", bytes, " bytes for ", name, " in /dev/shm: ", std::strerror(error));
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
bool all_ranks(MPI_Comm comm, bool ok, const char* what) {
  int value = ok ? 1 : 0;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MIN, comm), what);
  return value == 1;
}

} // namespace

SharedBuffers::SharedBuffers(std::string who, int rank, int size)
    : who_(std::move(who)), rank_(rank), size_(size), registry_(std::make_shared<Registry>()) {}

SharedBuffers::~SharedBuffers() = default;

void SharedBuffers::learn_node(MPI_Comm comm) {
  node_known_ = true;
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type (shared buffers)");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  // The same answer on every rank: each sees the whole group on its node,
  // or none does.
  one_node_ = node_size == size_;
  if (rank_ == 0) {
    std::random_device random;
    key_ = (static_cast<uint64_t>(random()) << 32) ^ random() ^
           (static_cast<uint64_t>(getpid()) << 16);
  }
  check_mpi(MPI_Bcast(&key_, 1, MPI_UINT64_T, 0, comm), "MPI_Bcast (shared buffers)");
}

at::Tensor SharedBuffers::allocate(MPI_Comm comm, int64_t numel, const at::TensorOptions& options) {
  if (!node_known_) {
    learn_node(comm);
  }
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  if (!one_node_ || bytes == 0) {
    return {};
  }
  const int64_t id = next_id_++;
  auto mapping = std::make_shared<SharedMapping>();
  mapping->id = id;
  mapping->bytes = bytes;
  mapping->bases.assign(static_cast<size_t>(size_), nullptr);
  const std::string own_name = object_name(key_, rank_, id);
  std::string why;
  mapping->bases[rank_] = create_own(own_name, bytes, why);
  bool ok = all_ranks(comm, mapping->bases[rank_] != nullptr, "MPI_Allreduce (shared buffers)");
  if (ok) {
    for (int r = 0; r < size_ && why.empty(); ++r) {
      if (r != rank_) {
        mapping->bases[r] = map_peer(object_name(key_, r, id), bytes, why);
      }
    }
    ok = all_ranks(comm, why.empty(), "MPI_Allreduce (shared buffers)");
  }
  if (mapping->bases[rank_] != nullptr) {
    // Every rank has mapped every object it could: the name is no longer
    // needed, and the memory goes when the last mapping does.
    shm_unlink(own_name.c_str());
  }
  if (!ok) {
    // `mapping`'s destructor unmaps what was mapped.
    if (!warned_) {
      warned_ = true;
      log_warning(c10::str(who_, " ProcessGroupMPI: buffers in shared memory are not available",
                           why.empty() ? std::string(" (another rank failed)") : ": " + why,
                           "; DDP's buckets use private memory and the allreduce sends messages"));
    }
    return {};
  }
  ++allocated_;
  uint8_t* base = mapping->bases[rank_];
  {
    std::lock_guard<std::mutex> lock(registry_->mutex);
    registry_->by_base.emplace(base, std::move(mapping));
  }
  // The deleter may run on any thread, after the group is gone.
  std::shared_ptr<Registry> registry = registry_;
  return at::from_blob(
      base, {numel},
      [registry](void* data) {
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
  if (offset + bytes <= mapping->bytes) {
    where.id = mapping->id;
    where.offset = static_cast<int64_t>(offset);
    where.mapping = mapping;
  }
  return where;
}

bool SharedBuffers::agree(MPI_Comm comm, const SharedLocation& where, int64_t bytes) const {
  // (v, -v) under MAX: every rank learns the largest and the smallest v.
  int64_t values[6] = {where.id, where.offset, bytes, -where.id, -where.offset, -bytes};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values, 6, MPI_INT64_T, MPI_MAX, comm),
            "MPI_Allreduce (shared buffer check)");
  return values[0] >= 0 && values[0] == -values[3] && values[1] == -values[4] &&
         values[2] == -values[5];
}

void SharedBuffers::allreduce(MPI_Comm comm, const at::Tensor& flat, const SharedLocation& where,
                              const ReduceKernel& kernel, bool average) const {
  // `agree` was the first barrier: every rank's buffer holds its input.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const int64_t count = flat.numel();
  const size_t element = flat.element_size();
  const int64_t per = (count + size_ - 1) / size_;
  const int64_t begin = std::min(count, per * rank_);
  const int64_t length = std::min(count, per * (rank_ + 1)) - begin;
  const auto at = [&](int r) {
    return where.mapping->bases[r] + where.offset + static_cast<size_t>(begin) * element;
  };
  // Chunk by chunk, so that a chunk's result is still in cache when it is
  // divided and copied to the peers: the segment is read from memory once.
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(element));
  for (int64_t done = 0; done < length; done += chunk) {
    const int64_t n = std::min(chunk, length - done);
    const size_t skip = static_cast<size_t>(done) * element;
    uint8_t* own = at(rank_) + skip;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) {
        kernel(own, own, at(r) + skip, static_cast<size_t>(n));
      }
    }
    if (average) {
      flat.narrow(0, begin + done, n).div_(size_);
    }
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) {
        std::memcpy(at(r) + skip, own, static_cast<size_t>(n) * element);
      }
    }
  }
  closing_barrier(comm, "MPI_Ibarrier (shared buffer allreduce)");
}

void SharedBuffers::allgather(MPI_Comm comm, const at::Tensor& output, const SharedLocation& where,
                              int64_t bytes) const {
  // `agree` was the first barrier: every rank's input is written.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  for (int i = 0; i < size_; ++i) {
    const int r = (rank_ + i) % size_; // each reader starts at a different peer
    const uint8_t* from = where.mapping->bases[r] + where.offset;
    uint8_t* to = out + static_cast<size_t>(r) * static_cast<size_t>(bytes);
    if (from != to) {
      std::memmove(to, from, static_cast<size_t>(bytes));
    }
  }
  closing_barrier(comm, "MPI_Ibarrier (shared buffer allgather)");
}

void SharedBuffers::closing_barrier(MPI_Comm comm, const char* what) const {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // A rank that finishes first waits for the others without spinning:
  // Note [MPI arrival wait].
  MPI_Request done = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &done), what);
  poll_request(&done, std::chrono::steady_clock::time_point::max(), what);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

} // namespace ddp::internal::mpi
