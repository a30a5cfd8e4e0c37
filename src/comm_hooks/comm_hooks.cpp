#include <ddp/comm_hooks/comm_hooks.h>

#include <ATen/ATen.h>

#include "internal/check.h"

namespace ddp::comm_hooks {

namespace {

// The callable that with_state makes: std::function::target finds it by
// its type, which is how register_comm_hook and the checkpoints see the
// state of any hook made by with_state.
struct StatefulHook {
  std::shared_ptr<CommHookState> state;
  CommHook hook;

  std::shared_ptr<Work> operator()(ProcessGroup& group, GradBucket& bucket) const {
    return hook(group, bucket);
  }
};

} // namespace

CommHook with_state(std::shared_ptr<CommHookState> state, CommHook hook) {
  DDP_CHECK(state != nullptr, "comm_hooks::with_state: the state is null");
  DDP_CHECK(hook != nullptr, "comm_hooks::with_state: the hook is empty");
  return StatefulHook{std::move(state), std::move(hook)};
}

std::shared_ptr<CommHookState> state_of(const CommHook& hook) {
  const auto* stateful = hook.target<StatefulHook>();
  return stateful ? stateful->state : nullptr;
}

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
