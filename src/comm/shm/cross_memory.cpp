// Gradients read where they lie: the cross-memory form of DDP's built-in
// allreduce for the buffers of shared_buffers.h.

#include "comm/shm/shared_buffers.h"

#include <ATen/ATen.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <random>

#include <ddp/comm/error.h>

#include "internal/check.h"
#include "internal/env.h"

namespace ddp::internal::shm {

// Note [Gradients read where they lie]
// Without gradient_as_bucket_view, DDP's built-in allreduce of a bucket
// copies each gradient into the bucket (times 1/world size), reduces the
// bucket, and copies the result back into the gradients: on one host in
// shared memory, each rank moves its gradients through memory about five
// times, and on a CPU whose memory bandwidth bounds the step (the 25M MLP of
// bench/ddp_step_bench.cpp) those copies are most of what DDP adds.
// Linux's cross-memory attach (process_vm_readv) lets a process copy from
// another's memory in one pass, so each rank can read its peers' gradients
// where autograd put them:
// 1. agree (the shared path's first exchange) also tells whether every rank
//    offers gradients that tile its bucket, with the same count; then a
//    second exchange gives every rank every peer's gradient addresses (and
//    checks that the layouts are the same, else every rank falls back).
// 2. Rank c computes chunk c of Gloo's ring (the chunks of ring_chunk_bytes)
//    piece by piece: it reads each peer's piece into scratch memory that
//    stays in cache, and writes y_c + (y_{c+1} + (... + (y_{c-2} +
//    y_{c-1}))) into its own gradient, where y_r is rank r's value times
//    `scale` rounded to the dtype (what the copy into the bucket computed,
//    at::mul with a wrapped scalar); the same operations in the same order
//    as the TCP path, so the same bits. Chunks are disjoint: no rank reads
//    memory that another writes in this phase.
// 3. A barrier; then each rank reads every other chunk's result from the
//    rank that computed it straight into its own gradients.
// 4. A closing barrier: no rank frees or changes its gradients (the
//    optimizer step, zero_grad) while a peer may still read them.
// Float and double only (other dtypes take the bucket copies), one host,
// and only when every rank could read every other's memory at the group's
// first shared allocation (probe_cross_memory: each reads a random word at
// the address its peer published, so that a pid that names another process
// here, ranks in separate pid namespaces, fails; ptrace rules, a
// container's seccomp profile or DDP_CROSS_MEMORY=0 can forbid it too). Failure: a read from
// a dead peer fails with ESRCH, and this rank's RemoteError names it; the
// others fail at the next barrier with the transport's error, which names
// it too, within the deadline. A read from a peer that has left the
// collective after an error of its own (its gradients freed, or its
// process exiting) fails with EFAULT: a RemoteError naming that peer too,
// and the group's first failure (Note [First failure]) names the rank that
// failed first.
// The bucket itself is left as it was (reduce_gradients' contract: its
// contents under the gradients are unspecified).

namespace {

// The piece of a chunk read from each peer before it is summed: with three
// peers, the scratch stays within a core's L2 cache.
constexpr int64_t kPieceBytes = 128 * 1024;
// The most (rank, gradient) pairs whose addresses one reduction exchanges.
constexpr int64_t kMaxAddresses = 16384;

// Copies `bytes` from `remote` in process `pid`, rank `peer`'s, to `local`,
// whole. `who`: this rank, for errors.
void read_peer(const std::string& who, int peer, pid_t pid, void* local, uint64_t remote, size_t bytes) {
  auto* to = static_cast<uint8_t*>(local);
  while (bytes > 0) {
    struct iovec l {to, bytes};
    struct iovec r {reinterpret_cast<void*>(remote), bytes};
    const ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0) {
      const int error = got < 0 ? errno : EIO;
      const std::string message =
          c10::str(who, " allreduce: reading rank ", peer, "'s gradients (process ", pid, ", process_vm_readv of ",
                   bytes, " bytes) failed: ", std::strerror(error));
      if (error == ESRCH) {
        // Worded as the transport's lost peers are ("lost ... rank N").
        throw RemoteError(message + "; lost rank " + std::to_string(peer) + ": its process has exited", peer);
      }
      if (error == EFAULT) {
        // The addresses were published for this collective and stay mapped
        // until its closing barrier, unless the peer gave it up.
        throw RemoteError(message + "; lost rank " + std::to_string(peer) +
                              ": its gradients are no longer mapped (it left the collective after an error, or is "
                              "exiting)",
                          peer);
      }
      throw CommError(message + (error == EPERM ? "; reading another process's memory is not permitted here, "
                                                  "DDP_CROSS_MEMORY=0 turns this path off"
                                                : ""));
    }
    to += got;
    remote += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

// y_c + (y_{c+1} + (... + (y_{c-2} + y_{c-1}))) into `out`, y = x * scale;
// peers[k] holds rank (c + k) mod n's values, k = 1 .. n-1. The file is
// compiled with -ffp-contract=off, so that no product and sum fuse.
template <typename T>
void scaled_ring_sum(T* out, const T* own, const std::vector<const T*>& peers, int n, size_t count, T scale) {
  if (n == 2) {
    const T* other = peers[1];
    for (size_t i = 0; i < count; ++i) {
      const T a = own[i] * scale;
      const T b = other[i] * scale;
      out[i] = a + b;
    }
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const T last = peers[n - 1][i] * scale;
    const T before = peers[n - 2][i] * scale;
    T partial = before + last;
    for (int k = n - 3; k >= 1; --k) {
      const T y = peers[k][i] * scale;
      partial = y + partial;
    }
    const T mine = own[i] * scale;
    out[i] = mine + partial;
  }
}

} // namespace

void SharedBuffers::probe_cross_memory(Coordinator& coordinator) {
  // Slots 3r to 3r+2: rank r's pid, the address of its probe word and the
  // word's value, random, so that a process that only happens to have rank
  // r's pid here (ranks in separate pid namespaces) does not pass; -1 from
  // a rank that opts out.
  std::vector<int64_t> values(3 * static_cast<size_t>(size_), -1);
  if (env_get(kEnvCrossMemory).value_or("1") != "0") {
    std::random_device random;
    probe_word_ = static_cast<int64_t>(((static_cast<uint64_t>(random()) << 32) ^ random()) >> 1);
    values[3 * rank_] = static_cast<int64_t>(getpid());
    values[3 * rank_ + 1] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(&probe_word_));
    values[3 * rank_ + 2] = probe_word_;
  }
  coordinator.max(values.data(), values.size());
  int64_t failed = 0;
  for (int r = 0; r < size_ && failed == 0; ++r) {
    if (values[3 * r] < 0) {
      failed = 1;
      break;
    }
    int64_t word = -1;
    struct iovec l {&word, sizeof(word)};
    struct iovec remote {reinterpret_cast<void*>(static_cast<uintptr_t>(values[3 * r + 1])), sizeof(word)};
    const ssize_t got = process_vm_readv(static_cast<pid_t>(values[3 * r]), &l, 1, &remote, 1, 0);
    failed = got == static_cast<ssize_t>(sizeof(word)) && word == values[3 * r + 2] ? 0 : 1;
  }
  coordinator.max(&failed, 1);
  cross_memory_ = failed == 0;
  if (cross_memory_) {
    pids_.assign(static_cast<size_t>(size_), 0);
    for (int r = 0; r < size_; ++r) {
      pids_[r] = values[3 * r];
    }
  }
}

int64_t SharedBuffers::direct_offer(const at::Tensor& flat, const std::vector<ReduceTarget>& targets) const {
  // The address exchange sends size x 2 x targets words to every rank: past
  // kMaxAddresses the buckets are cheaper.
  if (!cross_memory_ || multi_host() || targets.empty() ||
      static_cast<int64_t>(targets.size()) * size_ > kMaxAddresses ||
      (flat.scalar_type() != at::kFloat && flat.scalar_type() != at::kDouble)) {
    return -2;
  }
  // The targets must tile the buffer (ordered by offset, checked apart).
  int64_t at = 0;
  for (const auto& t : targets) {
    if (t.offset != at) {
      return -2;
    }
    at += t.target.numel();
  }
  return at == flat.numel() ? static_cast<int64_t>(targets.size()) : -2;
}

bool SharedBuffers::reduce_direct(Coordinator& coordinator, const at::Tensor& flat,
                                  const std::vector<ReduceTarget>& targets, double scale) const {
  const auto count = static_cast<int64_t>(targets.size());
  const auto n = static_cast<size_t>(size_);
  // Row r: rank r's targets, (offset, address) each.
  const size_t row = 2 * static_cast<size_t>(count);
  std::vector<int64_t> rows(n * row, std::numeric_limits<int64_t>::min());
  for (int64_t i = 0; i < count; ++i) {
    rows[rank_ * row + 2 * i] = targets[i].offset;
    rows[rank_ * row + 2 * i + 1] =
        static_cast<int64_t>(reinterpret_cast<uintptr_t>(targets[i].target.data_ptr()));
  }
  coordinator.max(rows.data(), rows.size());
  for (size_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < count; ++i) {
      if (rows[r * row + 2 * i] != targets[i].offset) {
        return false; // the same answer on every rank: each sees every row
      }
    }
  }
  ++allreduces_;
  ++direct_;
  test_kill_point("direct", rank_);
  const auto address = [&](int r, int64_t i) { return static_cast<uint64_t>(rows[r * row + 2 * i + 1]); };
  const size_t element = flat.element_size();
  const int64_t numel = flat.numel();
  const auto chunk = static_cast<int64_t>(
      ring_chunk_bytes(static_cast<size_t>(numel) * element, element, size_, kGlooMaxSegmentBytes) / element);
  const auto chunk_of = [&](int c) {
    const int64_t begin = std::min(numel, chunk * c);
    return std::make_pair(begin, std::min(numel, chunk * (c + 1)));
  };
  // Calls fn(i, from, to) for the parts [from, to) of target i in [begin, end).
  const auto each_part = [&](int64_t begin, int64_t end, const auto& fn) {
    auto it = std::upper_bound(targets.begin(), targets.end(), begin, [](int64_t at, const ReduceTarget& t) {
      return at < t.offset + t.target.numel();
    });
    for (; it != targets.end() && it->offset < end; ++it) {
      const int64_t from = std::max(begin, it->offset);
      const int64_t to = std::min(end, it->offset + it->target.numel());
      if (from < to) {
        fn(static_cast<int64_t>(it - targets.begin()), from, to);
      }
    }
  };
  const auto local = [&](int64_t i, int64_t at) {
    return static_cast<uint8_t*>(targets[i].target.data_ptr()) + static_cast<size_t>(at - targets[i].offset) * element;
  };
  const auto remote = [&](int r, int64_t i, int64_t at) {
    return address(r, i) + static_cast<uint64_t>(at - targets[i].offset) * element;
  };

  // Phase 2 of the Note: this rank's chunk.
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(element));
  thread_local std::vector<uint8_t> scratch;
  scratch.resize(static_cast<size_t>(piece) * element * (n - 1));
  const auto [mine_begin, mine_end] = chunk_of(rank_);
  each_part(mine_begin, mine_end, [&](int64_t i, int64_t from, int64_t to) {
    for (int64_t at = from; at < to; at += piece) {
      const int64_t m = std::min(piece, to - at);
      for (int k = 1; k < size_; ++k) {
        const int peer = (rank_ + k) % size_;
        read_peer(who_, peer, static_cast<pid_t>(pids_[peer]),
                  scratch.data() + static_cast<size_t>(k - 1) * piece * element, remote(peer, i, at),
                  static_cast<size_t>(m) * element);
      }
      uint8_t* own = local(i, at);
      if (flat.scalar_type() == at::kFloat) {
        std::vector<const float*> peers(n, nullptr);
        for (int k = 1; k < size_; ++k) {
          peers[k] = reinterpret_cast<const float*>(scratch.data()) + static_cast<size_t>(k - 1) * piece;
        }
        scaled_ring_sum(reinterpret_cast<float*>(own), reinterpret_cast<const float*>(own), peers, size_,
                        static_cast<size_t>(m), static_cast<float>(scale));
      } else {
        std::vector<const double*> peers(n, nullptr);
        for (int k = 1; k < size_; ++k) {
          peers[k] = reinterpret_cast<const double*>(scratch.data()) + static_cast<size_t>(k - 1) * piece;
        }
        scaled_ring_sum(reinterpret_cast<double*>(own), reinterpret_cast<const double*>(own), peers, size_,
                        static_cast<size_t>(m), scale);
      }
    }
  });
  coordinator.barrier();
  // Phase 3: the other chunks, from the ranks that computed them.
  for (int k = 1; k < size_; ++k) {
    const int c = (rank_ + k) % size_;
    const auto [begin, end] = chunk_of(c);
    each_part(begin, end, [&](int64_t i, int64_t from, int64_t to) {
      read_peer(who_, c, static_cast<pid_t>(pids_[c]), local(i, from), remote(c, i, from),
                static_cast<size_t>(to - from) * element);
    });
  }
  coordinator.barrier();
  return true;
}

} // namespace ddp::internal::shm
