#pragma once

/// Types shared by every collective: the reduce operations, the one timeout
/// sentinel of the library, and a small options aggregate per collective
/// (the shapes of c10d's `Types.hpp`, with our names).

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

/// Element-wise reduction applied by `allreduce`, `reduce` and
/// `reduce_scatter`. The bitwise operations apply to integer and bool tensors
/// only; `kAvg` divides the sum by the world size and needs a floating dtype.
enum class ReduceOp : uint8_t {
  kSum,
  kAvg,
  kProduct,
  kMin,
  kMax,
  kBand,
  kBor,
  kBxor,
};

/// The operation's name as torch.distributed spells it ("SUM", "AVG", ...).
std::string to_string(ReduceOp op);

/// Sentinel for "use the timeout the process group was created with".
/// It is the only sentinel: every `timeout` field in the library accepts it.
constexpr std::chrono::milliseconds kUseGroupTimeout{-1};

/// Default timeout of a process group, as in PyTorch: 30 minutes.
constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

/// Options of `ProcessGroup::allreduce` and `allreduce_coalesced`.
/// Example: `pg->allreduce(t, {ddp::ReduceOp::kMax})`.
struct AllreduceOptions {
  /// How elements are combined. Default: kSum.
  ReduceOp op = ReduceOp::kSum;
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::broadcast`.
struct BroadcastOptions {
  /// Rank whose tensor is sent to all. Default: 0.
  int root_rank = 0;
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::reduce`.
struct ReduceOptions {
  /// How elements are combined. Default: kSum.
  ReduceOp op = ReduceOp::kSum;
  /// Rank that receives the result. Default: 0.
  int root_rank = 0;
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::allgather` and `allgather_into_tensor`.
struct AllgatherOptions {
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::gather`.
struct GatherOptions {
  /// Rank that receives every rank's tensor. Default: 0.
  int root_rank = 0;
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::scatter`.
struct ScatterOptions {
  /// Rank that holds the tensors to scatter. Default: 0.
  int root_rank = 0;
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::reduce_scatter`.
struct ReduceScatterOptions {
  /// How elements are combined. Default: kSum.
  ReduceOp op = ReduceOp::kSum;
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::alltoall`.
struct AlltoallOptions {
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
  /// Rows (along the first dimension) of `input` sent to each rank, one
  /// entry per rank, PyTorch's `input_split_sizes`. Empty: size() equal
  /// chunks.
  std::vector<int64_t> input_split_sizes;
  /// Rows of `output` received from each rank (`output_split_sizes`); rank
  /// r's must equal what rank r sends this rank. Empty: size() equal chunks.
  std::vector<int64_t> output_split_sizes;
};

/// Options of `ProcessGroup::barrier`.
struct BarrierOptions {
  /// Deadline of the operation. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

/// Options of `ProcessGroup::send` and `recv`.
struct PointToPointOptions {
  /// Matches a send with a receive between the same two ranks. Default: 0.
  int tag = 0;
  /// Deadline of the transfer. Default: kUseGroupTimeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

} // namespace ddp
