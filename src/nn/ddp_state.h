#pragma once

// DistributedDataParallelImpl's state besides the wrapped module (private
// header: the public one holds a pointer to it, so that its layout and the
// Reducer stay out of users' builds). Read by distributed_data_parallel.cpp
// and by ddp::Join (join.cpp), the wrapper's friend.

#include <memory>
#include <vector>

#include <ddp/nn/distributed_data_parallel.h>

namespace ddp {

namespace internal {
class Reducer;
} // namespace internal

struct DistributedDataParallelImpl::State {
  explicit State(DistributedDataParallelOptions options) : options(std::move(options)) {}

  DistributedDataParallelOptions options;
  std::shared_ptr<ProcessGroup> group;
  // Each buffer once, in named_buffers() order.
  std::vector<at::Tensor> buffers;
  // Of the replica's parameters; the CPU when it has none.
  c10::Device device = c10::Device(c10::kCPU);
  // Shared so that the first static_graph iteration's output sink can hold
  // it weakly (Note [Delayed reduction] in src/reducer/static_graph.cpp).
  std::shared_ptr<internal::Reducer> reducer;
  // The registered hook's state (comm_hooks::with_state), for checkpoints.
  std::shared_ptr<CommHookState> comm_hook_state;
  // Non-owning: set by a live ddp::Join on this module, which unsets it
  // before it ends.
  Join* join = nullptr;
  // Whether the last forward ran with gradients enabled and outside
  // no_sync(): only then does the next forward broadcast the buffers, as
  // PyTorch's (require_forward_param_sync).
  bool last_forward_synchronised = true;
  // When the forward being traced began (Note [Timeline]); 0: none is.
  int64_t timeline_forward_start_us = 0;
};

} // namespace ddp
