#pragma once

// A one-round allreduce for small buffers (private header). See Note
// [Exchange allreduce] in gloo_exchange_allreduce.cpp.

#include "comm/gloo/gloo_api.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/reduce_kernels.h"

namespace ddp::internal {

// Buffers of at most this many bytes take the exchange algorithm (with at
// most kExchangeAllreduceMaxRanks ranks); larger ones Gloo's ring.
constexpr size_t kExchangeAllreduceMaxBytes = 64 * 1024;
constexpr int kExchangeAllreduceMaxRanks = 8;

// Whether an allreduce of `bytes` over `ranks` ranks takes the exchange.
bool use_exchange_allreduce(size_t bytes, int ranks);

// Reduces `data` (`count` elements, `bytes` bytes in all, host memory) across
// the context's ranks in place: every rank sends its buffer to every other
// rank, receives theirs, and combines all of them in rank order with
// `kernel`, so every rank computes the same result bit for bit. Messages use
// Gloo slot (kExchangeSlotPrefix, tag). Throws gloo::IoException on a
// timeout or a lost peer, as Gloo's own algorithms do.
void exchange_allreduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                        size_t bytes, const ReduceKernel& kernel, uint32_t tag,
                        std::chrono::milliseconds timeout);

// exchange_allreduce among `members` alone (ascending, this rank among
// them), combining in their order, with Gloo slot (slot_prefix, tag).
void exchange_among(const std::shared_ptr<gloo::Context>& context, const std::vector<int>& members,
                    uint8_t slot_prefix, void* data, size_t count, size_t bytes,
                    const ReduceKernel& kernel, uint32_t tag, std::chrono::milliseconds timeout);

// The same result as exchange_among, bit for bit, in a reduce-scatter and
// an all-gather among `members` when they are more than two (Note [Reduced
// among hosts] in gloo_exchange_allreduce.cpp).
void scatter_gather_among(const std::shared_ptr<gloo::Context>& context, const std::vector<int>& members,
                          uint8_t slot_prefix, void* data, size_t count, size_t bytes,
                          const ReduceKernel& kernel, uint32_t tag, std::chrono::milliseconds timeout);

// See Note [Direct reduce-scatter] in gloo_exchange_allreduce.cpp.
// `inputs[r]` is this rank's chunk for rank r, `counts[r]` elements of
// `element_bytes` each; rank `context->rank`'s reduced chunk is written to
// `output` (counts[rank] elements).
void direct_reduce_scatter(const std::shared_ptr<gloo::Context>& context,
                           const std::vector<const void*>& inputs, const std::vector<size_t>& counts,
                           size_t element_bytes, void* output, const ReduceKernel& kernel, uint32_t tag,
                           std::chrono::milliseconds timeout);

} // namespace ddp::internal
