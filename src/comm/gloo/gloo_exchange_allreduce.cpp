// Note [Exchange allreduce]
// Gloo's ring allreduce takes 2 * (n - 1) steps, each a message that one rank
// must receive before it sends the next. For a small buffer every step costs
// a loopback or network round of latency, not bandwidth: DDP's ToyModel
// bucket (660 bytes) spent two of them per step. Below
// kExchangeAllreduceMaxBytes every rank instead sends its whole buffer to
// every other rank at once and receives theirs: one step of latency, n - 1
// messages each way, (n - 1) x the bytes of the ring. Each rank then
// combines the n buffers in rank order (0, 1, ..., n - 1), so that all ranks
// hold the same bits, as the ring guarantees too. Past 8 ranks or 64 KiB the
// extra bytes cost more than the saved steps, and the ring runs.

#include "comm/gloo/gloo_exchange_allreduce.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace ddp::internal {

namespace {

// Slot prefix of the exchange; Gloo's algorithms use 0x01 to 0x08, send/recv
// 0x20, the shared buffers' coordination 0x22 and 0x23.
constexpr uint8_t kExchangeSlotPrefix = 0x21;

// Where the exchanges receive: kept by the calling thread (a group's worker)
// from one collective to the next. Fresh memory for every call cost each
// rank a page fault per 4 KiB received and the zeroing of every byte, as
// much CPU as the transfer itself where the link is fast; the largest
// buffer received stays (DDP's: a bucket).
char* scratch(size_t bytes) {
  thread_local std::vector<char> kept;
  if (kept.size() < bytes) {
    kept = std::vector<char>();
    kept.resize(bytes);
  }
  return kept.data();
}

} // namespace

bool use_exchange_allreduce(size_t bytes, int ranks) {
  return ranks > 1 && ranks <= kExchangeAllreduceMaxRanks && bytes <= kExchangeAllreduceMaxBytes;
}

void exchange_allreduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                        size_t bytes, const ReduceKernel& kernel, uint32_t tag,
                        std::chrono::milliseconds timeout) {
  std::vector<int> everyone(static_cast<size_t>(context->size));
  for (int r = 0; r < context->size; ++r) {
    everyone[r] = r;
  }
  exchange_among(context, everyone, kExchangeSlotPrefix, data, count, bytes, kernel, tag, timeout);
}

void exchange_among(const std::shared_ptr<gloo::Context>& context, const std::vector<int>& members,
                    uint8_t slot_prefix, void* data, size_t count, size_t bytes,
                    const ReduceKernel& kernel, uint32_t tag, std::chrono::milliseconds timeout) {
  const size_t n = members.size();
  const auto me = static_cast<size_t>(std::find(members.begin(), members.end(), context->rank) - members.begin());
  if (n < 2 || bytes == 0) {
    return;
  }
  // Slot k of `all` holds member k's buffer; our own is sent from it too.
  char* const all = scratch(bytes * n);
  std::memcpy(all + bytes * me, data, bytes);
  auto buffer = context->createUnboundBuffer(all, bytes * n);
  const uint64_t slot = gloo::Slot::build(slot_prefix, tag);
  for (size_t k = 0; k < n; ++k) {
    if (k != me) {
      buffer->recv(members[k], slot, bytes * k, bytes);
    }
  }
  for (size_t k = 0; k < n; ++k) {
    if (k != me) {
      buffer->send(members[k], slot, bytes * me, bytes);
    }
  }
  // One deadline for all the waits. Gloo throws IoException on a timeout or a
  // lost connection; false means aborted, which nothing here does.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t i = 1; i < n; ++i) {
    if (!buffer->waitRecv(deadline)) {
      throw gloo::IoException("exchange allreduce: receive aborted");
    }
  }
  for (size_t i = 1; i < n; ++i) {
    if (!buffer->waitSend(deadline)) {
      throw gloo::IoException("exchange allreduce: send aborted");
    }
  }
  // In member order, the same on every member.
  std::memcpy(data, all, bytes);
  for (size_t k = 1; k < n; ++k) {
    kernel(data, data, all + bytes * k, count);
  }
}

// Note [Reduced among hosts]
// The multi-host form of the shared allreduce (Note [Shared buffers])
// reduces each part of a host's buffers among the ranks of one local index,
// one per host. The exchange would send the whole part to every other host:
// (h - 1) times its bytes from each rank, h / 2 times a ring's 2 (h - 1) / h
// (twice the bytes on four hosts, four times on eight). Past two members
// and kExchangeAllreduceMaxBytes, scatter_gather_among runs instead: member
// k receives chunk k of every member's part and combines them in member
// order, the exchange's order, so the same bits; then it sends its combined
// chunk to every other member. Each rank sends 2 (h - 1) / h of the part,
// as a ring does, in two rounds of latency instead of 2 (h - 1).
void scatter_gather_among(const std::shared_ptr<gloo::Context>& context, const std::vector<int>& members,
                          uint8_t slot_prefix, void* data, size_t count, size_t bytes,
                          const ReduceKernel& kernel, uint32_t tag, std::chrono::milliseconds timeout) {
  const size_t n = members.size();
  const auto me = static_cast<size_t>(std::find(members.begin(), members.end(), context->rank) - members.begin());
  if (n < 3 || count < n) {
    exchange_among(context, members, slot_prefix, data, count, bytes, kernel, tag, timeout);
    return;
  }
  const size_t element = bytes / count;
  const auto first = [&](size_t k) { return count * k / n * element; }; // chunk k's first byte
  const auto length = [&](size_t k) { return first(k + 1) - first(k); };
  const size_t mine = length(me);
  char* const own = static_cast<char*>(data) + first(me);
  const uint64_t slot = gloo::Slot::build(slot_prefix, tag);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto wait = [&](gloo::transport::UnboundBuffer& buffer, bool receives) {
    for (size_t i = 1; i < n; ++i) {
      if (!(receives ? buffer.waitRecv(deadline) : buffer.waitSend(deadline))) {
        throw gloo::IoException(std::string("reduction among hosts: ") + (receives ? "receive" : "send") +
                                " aborted");
      }
    }
  };
  // Round 1: chunk k of this part to member k; member k's chunk `me` into
  // slot k of `parts` (our own copied there, to combine in member order).
  char* const parts = scratch(mine * n);
  auto received = context->createUnboundBuffer(parts, mine * n);
  auto part = context->createUnboundBuffer(data, bytes);
  for (size_t k = 0; k < n; ++k) {
    if (k != me) {
      received->recv(members[k], slot, mine * k, mine);
    }
  }
  for (size_t k = 0; k < n; ++k) {
    if (k != me) {
      part->send(members[k], slot, first(k), length(k));
    }
  }
  std::memcpy(parts + mine * me, own, mine);
  wait(*received, true);
  const size_t elements = mine / element;
  kernel(own, parts, parts + mine, elements);
  for (size_t k = 2; k < n; ++k) {
    kernel(own, own, parts + mine * k, elements);
  }
  // Round 2, once every send of round 1 is done: our combined chunk to
  // every member, theirs into place over what round 1 sent.
  wait(*part, false);
  for (size_t k = 0; k < n; ++k) {
    if (k != me) {
      part->recv(members[k], slot, first(k), length(k));
    }
  }
  for (size_t k = 0; k < n; ++k) {
    if (k != me) {
      part->send(members[k], slot, first(me), mine);
    }
  }
  wait(*part, true);
  wait(*part, false);
}

// Note [Direct reduce-scatter]
// Gloo has no reduce-scatter for every dtype and uneven chunks. Each rank
// sends chunk r of its input straight to rank r and receives its own chunk
// from every other rank, all at once, then adds them to its own (only this
// rank computes its chunk: no other rank must agree with the order). A rank sends
// and receives (n - 1) / n of the input's bytes, as many as a ring
// reduce-scatter, in one step of latency instead of n - 1.
//
// The lowest-ranked peer's part is received straight into `output`, the
// others' (n - 2 of them) into a scratch buffer, and `output` becomes
// own + that part, then + the others in rank order: the order of a sum
// that starts from our own part, with no copy of it. Receiving into fresh
// memory is what costs: on loopback TCP a 12.5 MB receive into pages never
// touched took twice as long as into the caller's (reused) output, so with
// two ranks nothing else is allocated.
void direct_reduce_scatter(const std::shared_ptr<gloo::Context>& context,
                           const std::vector<const void*>& inputs, const std::vector<size_t>& counts,
                           size_t element_bytes, void* output, const ReduceKernel& kernel, uint32_t tag,
                           std::chrono::milliseconds timeout) {
  const int size = context->size;
  const auto me = static_cast<size_t>(context->rank);
  const size_t mine = counts[me] * element_bytes;
  if (size == 1) {
    if (mine > 0) {
      std::memmove(output, inputs[me], mine); // output may be inputs[me] itself
    }
    return;
  }
  const size_t first_peer = me == 0 ? 1 : 0;
  // Slot k of `scratch` receives the part of the k-th peer after the first
  // (in rank order).
  at::Tensor scratch;
  if (mine > 0 && size > 2) {
    scratch = at::empty({static_cast<int64_t>(mine) * (size - 2)}, at::kByte);
  }
  auto* slots = scratch.defined() ? static_cast<char*>(scratch.data_ptr()) : nullptr;
  auto slot_of = [&](size_t peer) { return (peer < me ? peer : peer - 1) - 1; };
  const uint64_t slot = gloo::Slot::build(kExchangeSlotPrefix, tag);
  std::unique_ptr<gloo::transport::UnboundBuffer> into_output;
  std::unique_ptr<gloo::transport::UnboundBuffer> into_scratch;
  if (mine > 0) {
    // The output aliases inputs[me] when the caller reduces in place: our
    // part must be read before the first peer's lands there.
    const bool in_place = output == inputs[me];
    if (in_place) {
      scratch = at::empty({static_cast<int64_t>(mine) * (size - 1)}, at::kByte);
      std::memcpy(static_cast<char*>(scratch.data_ptr()) + mine * (size - 2), inputs[me], mine);
      slots = static_cast<char*>(scratch.data_ptr());
    }
    into_output = context->createUnboundBuffer(output, mine);
    into_output->recv(static_cast<int>(first_peer), slot, 0, mine);
    if (size > 2) {
      into_scratch = context->createUnboundBuffer(slots, mine * static_cast<size_t>(size - 2));
      for (size_t peer = first_peer + 1; peer < static_cast<size_t>(size); ++peer) {
        if (peer != me) {
          into_scratch->recv(static_cast<int>(peer), slot, mine * slot_of(peer), mine);
        }
      }
    }
  }
  // Gloo's buffers are not const, but a send only reads.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends;
  for (size_t peer = 0; peer < static_cast<size_t>(size); ++peer) {
    const size_t theirs = counts[peer] * element_bytes;
    if (peer != me && theirs > 0) {
      sends.push_back(context->createUnboundBuffer(const_cast<void*>(inputs[peer]), theirs));
      sends.back()->send(static_cast<int>(peer), slot, 0, theirs);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (mine > 0) {
    if (!into_output->waitRecv(deadline)) {
      throw gloo::IoException("reduce_scatter: receive aborted");
    }
    for (int i = 2; i < size; ++i) {
      if (!into_scratch->waitRecv(deadline)) {
        throw gloo::IoException("reduce_scatter: receive aborted");
      }
    }
  }
  for (auto& send : sends) {
    if (!send->waitSend(deadline)) {
      throw gloo::IoException("reduce_scatter: send aborted");
    }
  }
  if (mine == 0) {
    return;
  }
  const size_t count = counts[me];
  const void* own = output == inputs[me] ? slots + mine * (size - 2) : inputs[me];
  kernel(output, own, output, count);
  for (size_t peer = first_peer + 1; peer < static_cast<size_t>(size); ++peer) {
    if (peer != me) {
      kernel(output, output, slots + mine * slot_of(peer), count);
    }
  }
}

} // namespace ddp::internal
