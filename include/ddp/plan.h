#pragma once

/// A plan: what one rank of a job holds and sends, read in one process with
/// the fake backend (DDP_BACKEND=fake, `ddprun --plan`), or in a real run to
/// compare. See docs/scaling.md.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ddp/comm/process_group_fake.h>

namespace ddp {

/// This process's figures so far. Memory is counted from the first
/// `init_process_group` with the fake backend or with DDP_PLAN_REPORT set
/// (before it, `counting_memory` is false and the memory figures are 0);
/// bytes are counted by fake groups only (`bytes_counted`).
struct PlanReport {
  int rank = -1;
  int world_size = 0;
  /// The default group's backend ("fake", "gloo", ...).
  std::string backend;
  /// Whether CPU tensor memory is being counted.
  bool counting_memory = false;
  /// Bytes of CPU tensors allocated since counting began and not yet freed,
  /// and the most held at once: the model, gradients, optimizer state,
  /// buckets, gathered units and activations; not LibTorch's or a backend's
  /// own buffers, nor CUDA memory.
  int64_t tensor_bytes = 0;
  int64_t peak_tensor_bytes = 0;
  /// The most held at once before the first step (construction), and in
  /// each step (steps as below, the last 1000; the last one's so far).
  int64_t setup_peak_tensor_bytes = 0;
  std::vector<int64_t> step_peak_tensor_bytes;
  /// The process's peak resident set (getrusage), for comparison.
  int64_t peak_rss_bytes = 0;
  /// Whether a fake group counted the bytes below.
  bool bytes_counted = false;
  /// Bytes this rank would have sent before the first step (construction's
  /// broadcasts and checks), and in each step: a step runs from one
  /// DistributedDataParallel or FullyShardedDataParallel forward with
  /// gradients to the next (the last one to now; the last 1000 steps are
  /// kept), so a ZeroRedundancyOptimizer step counts in the step of the
  /// forward before it. Steps are marked only in a process that plans (the
  /// fake backend or DDP_PLAN_REPORT).
  int64_t setup_bytes_sent = 0;
  std::vector<int64_t> step_bytes_sent;
  /// Every fake group's operations together, by kind.
  std::map<std::string, FakeTraffic> traffic;
  /// The operations of the last step so far (before the first step,
  /// construction's), in the order they were issued (the first 65536):
  /// their kind, the bytes this rank would have sent, and the bytes of the
  /// operation's tensor here (an allgather's or alltoall's input, a
  /// reduce_scatter's or scatter's output), and its group (an index into
  /// `groups`). What a cost model prices one by one (bench/scaling/); in
  /// the JSON, [op, bytes_sent, tensor_bytes, group].
  struct Call {
    std::string op;
    int64_t bytes_sent = 0;
    int64_t tensor_bytes = 0;
    int group = 0;
  };
  std::vector<Call> last_step_calls;
  /// The world ranks of each fake group that issued an operation, in the
  /// order they first did (the default group's are 0 .. W - 1; HSDP's shard
  /// and replicate groups theirs).
  std::vector<std::vector<int>> groups;
};

/// The figures so far. Never throws.
PlanReport plan_report();

/// Writes them as JSON to DIR/plan_rank_<R>.json when DDP_PLAN_REPORT=DIR is
/// set (and returns the path; "" otherwise or when writing failed, with a
/// warning). `destroy_process_group()` and the process's exit write it too.
std::string write_plan_report();

} // namespace ddp
