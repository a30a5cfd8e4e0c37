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

#include <chrono>
#include <cstring>
#include <vector>

namespace ddp::internal {

namespace {

// Slot prefix of the exchange; Gloo's algorithms use 0x01 to 0x08, send/recv
// 0x20.
constexpr uint8_t kExchangeSlotPrefix = 0x21;

} // namespace

bool use_exchange_allreduce(size_t bytes, int ranks) {
  return ranks > 1 && ranks <= kExchangeAllreduceMaxRanks && bytes <= kExchangeAllreduceMaxBytes;
}

void exchange_allreduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                        size_t bytes, const ReduceKernel& kernel, uint32_t tag,
                        std::chrono::milliseconds timeout) {
  const int size = context->size;
  const int rank = context->rank;
  if (size == 1 || bytes == 0) {
    return;
  }
  // Slot r of `all` holds rank r's buffer; our own is sent from it too.
  std::vector<char> all(bytes * static_cast<size_t>(size));
  std::memcpy(all.data() + bytes * rank, data, bytes);
  auto buffer = context->createUnboundBuffer(all.data(), all.size());
  const uint64_t slot = gloo::Slot::build(kExchangeSlotPrefix, tag);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) {
      buffer->recv(peer, slot, bytes * peer, bytes);
    }
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) {
      buffer->send(peer, slot, bytes * rank, bytes);
    }
  }
  // One deadline for all the waits. Gloo throws IoException on a timeout or a
  // lost connection; false means aborted, which nothing here does.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int i = 1; i < size; ++i) {
    if (!buffer->waitRecv(deadline)) {
      throw gloo::IoException("exchange allreduce: receive aborted");
    }
  }
  for (int i = 1; i < size; ++i) {
    if (!buffer->waitSend(deadline)) {
      throw gloo::IoException("exchange allreduce: send aborted");
    }
  }
  // In rank order, the same on every rank.
  std::memcpy(data, all.data(), bytes);
  for (int r = 1; r < size; ++r) {
    kernel(data, data, all.data() + bytes * r, count);
  }
}

// Note [Direct reduce-scatter]
// Gloo has no reduce-scatter for every dtype and uneven chunks. Each rank
// sends chunk r of its input straight to rank r and receives its own chunk
// from every other rank, all at once, then adds them to its own (only this
// rank computes its chunk: no other rank must agree with the order). A rank sends
// and receives (n - 1) / n of the input's bytes, as many as a ring
// reduce-scatter, in one step of latency instead of n - 1; the receive
// buffer holds n chunks of this rank's size.
void direct_reduce_scatter(const std::shared_ptr<gloo::Context>& context,
                           const std::vector<const void*>& inputs, const std::vector<size_t>& counts,
                           size_t element_bytes, void* output, const ReduceKernel& kernel, uint32_t tag,
                           std::chrono::milliseconds timeout) {
  const int size = context->size;
  const auto me = static_cast<size_t>(context->rank);
  const size_t mine = counts[me] * element_bytes;
  if (mine > 0) {
    std::memmove(output, inputs[me], mine); // output may be inputs[me] itself
  }
  if (size == 1) {
    return;
  }
  // Slot r of `slots` receives rank r's part of this rank's chunk (our own
  // slot stays unused).
  // Not zeroed: every byte that is read is received first.
  auto chunks = at::empty({static_cast<int64_t>(mine) * size}, at::kByte);
  auto* slots = static_cast<char*>(chunks.data_ptr());
  const uint64_t slot = gloo::Slot::build(kExchangeSlotPrefix, tag);
  std::unique_ptr<gloo::transport::UnboundBuffer> receive;
  if (mine > 0) {
    receive = context->createUnboundBuffer(slots, mine * static_cast<size_t>(size));
    for (size_t peer = 0; peer < static_cast<size_t>(size); ++peer) {
      if (peer != me) {
        receive->recv(static_cast<int>(peer), slot, mine * peer, mine);
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
  for (int i = 1; mine > 0 && i < size; ++i) {
    if (!receive->waitRecv(deadline)) {
      throw gloo::IoException("reduce_scatter: receive aborted");
    }
  }
  for (auto& send : sends) {
    if (!send->waitSend(deadline)) {
      throw gloo::IoException("reduce_scatter: send aborted");
    }
  }
  // Only this rank computes its chunk, so the order of the sum cannot make
  // ranks disagree: our own part first, then the others' in rank order.
  const size_t count = counts[me];
  for (size_t r = 0; mine > 0 && r < static_cast<size_t>(size); ++r) {
    if (r != me) {
      kernel(output, output, slots + mine * r, count);
    }
  }
}

} // namespace ddp::internal
