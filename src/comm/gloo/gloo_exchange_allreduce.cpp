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

} // namespace ddp::internal
