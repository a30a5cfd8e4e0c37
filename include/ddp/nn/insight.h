#pragma once

/// What DistributedDataParallel measured of its last iteration
/// (`last_iteration_insight()`) and how it buckets the gradients
/// (`bucket_layout()`); docs/ddp.md, "Insight and debugging".

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

/// Where each bucket's gradients come from, and what it cost last iteration.
struct BucketInsight {
  /// Position in launch order.
  size_t index = 0;
  /// Names of the parameters, in the bucket's order.
  std::vector<std::string> parameter_names;
  /// Element type and size of the flat buffer.
  std::string dtype;
  size_t bytes = 0;
  /// True for the bucket of one sparse gradient (an Embedding's or
  /// EmbeddingBag's with sparse(true)): `bytes` are then those of its
  /// indices and values when it was last reduced (0 before).
  bool sparse = false;
  /// When its communication started and finished, in ms after the first
  /// gradient of the backward pass was ready.
  double launch_ms = 0;
  double done_ms = 0;
};

/// Figures of one training iteration (forward + backward).
struct IterationInsight {
  /// Iterations with gradient synchronisation so far (this one included).
  int64_t iteration = 0;
  /// Time in DistributedDataParallel's forward (buffer broadcast included).
  double forward_ms = 0;
  /// From the first gradient ready to the last: the window of backward in
  /// which communication can overlap computation.
  double backward_compute_ms = 0;
  /// Time spent at the end of backward waiting for communication.
  double comm_wait_ms = 0;
  /// Sum over buckets of their communication time.
  double comm_ms = 0;
  /// Share of `comm_ms` that ran while backward was still computing, in [0, 1].
  double overlap_fraction = 0;
  /// True when the first bucket's communication started before the last
  /// gradient was ready.
  bool first_bucket_started_before_backward_end = false;
  /// The buckets, in launch order.
  std::vector<BucketInsight> buckets;

  /// A few human-readable lines (what DDP_DEBUG=1 prints on rank 0).
  std::string to_string() const;
};

} // namespace ddp
