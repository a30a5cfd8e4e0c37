#pragma once

/// Batched point-to-point, PyTorch's `P2POp` and `batch_isend_irecv`: a
/// list of sends and receives posted together, for pipelines and ring
/// exchanges. See docs/collectives.md.

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/comm/work.h>

namespace ddp {

/// One send or receive of `batch_isend_irecv`. `peer` is a global rank (the
/// default group's), as in PyTorch; `group` nullptr means the default group.
/// Example: `ddp::P2POp::isend(tensor, (rank + 1) % world)`.
struct P2POp {
  bool is_send = true;
  at::Tensor tensor;
  int peer = 0;
  std::shared_ptr<ProcessGroup> group;
  int tag = 0;

  static P2POp isend(at::Tensor tensor, int peer, std::shared_ptr<ProcessGroup> group = nullptr, int tag = 0);
  static P2POp irecv(at::Tensor tensor, int peer, std::shared_ptr<ProcessGroup> group = nullptr, int tag = 0);
};

/// Posts every op of `ops` (all of one group) before any completes and
/// returns their Works, in order: wait on each (NCCL: one group launch, the
/// same Work for every op). Pairs posted in any order on the two sides do
/// not deadlock. Throws `c10::Error`, naming this rank and the op, for an
/// empty list, ops of different groups, a peer outside the group or this
/// rank itself, a negative tag, or a process outside the group; nothing is
/// posted then.
std::vector<std::shared_ptr<Work>> batch_isend_irecv(const std::vector<P2POp>& ops);

} // namespace ddp
