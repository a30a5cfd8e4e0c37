#include <ddp/nn/comm_hooks.h>

#include <ATen/ATen.h>

namespace ddp::comm_hooks {

CommHook allreduce() {
  return [](ProcessGroup& group, GradBucket& bucket) -> std::shared_ptr<Work> {
    const at::Tensor& buffer = bucket.buffer();
    if (group.size() == 1) {
      // The mean of one rank: nothing to send. A sparse gradient comes out
      // coalesced, as from a sparse allreduce.
      return Work::completed({buffer.is_sparse() ? buffer.coalesce() : buffer});
    }
    buffer.div_(group.size());
    return group.allreduce(buffer);
  };
}

namespace {
CommHook compressing(at::ScalarType wire_dtype) {
  return [wire_dtype](ProcessGroup& group, GradBucket& bucket) -> std::shared_ptr<Work> {
    at::Tensor buffer = bucket.buffer();
    if (group.size() == 1) {
      return Work::completed({buffer.is_sparse() ? buffer.coalesce() : buffer});
    }
    auto compressed = buffer.to(wire_dtype).div_(group.size());
    // Decompressing runs on the process group's thread when the allreduce
    // completes.
    return group.allreduce(compressed)->then([buffer](const std::vector<at::Tensor>& reduced) {
      buffer.copy_(reduced[0]);
      return std::vector<at::Tensor>{buffer};
    });
  };
}
} // namespace

CommHook fp16_compress() {
  return compressing(at::kHalf);
}

CommHook bf16_compress() {
  return compressing(at::kBFloat16);
}

} // namespace ddp::comm_hooks
