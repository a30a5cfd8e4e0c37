#pragma once

// Where a DistributedSampler sits when its options leave num_replicas or rank
// unset (private header).
//
// The lookup lives in its own translation unit and OBJECT library
// (ddp_data_pg, see src/data/data.cmake) so that the sampler itself does not
// depend on the process-group code: the sampler's unit tests link a fake
// definition instead (tests/data/fake_default_placement.cpp).

namespace ddp::internal {

// Rank and size of the default process group.
struct DefaultPlacement {
  // Default: 0, a world of size 1.
  int rank = 0;
  // Default: 1, a world of size 1.
  int num_replicas = 1;
  // True when the values came from an initialized default process group,
  // false when none was initialized; used in error messages.
  bool from_process_group = false;
};

// The default process group's rank and size when `ddp::is_initialized()`,
// else rank 0 of 1.
DefaultPlacement default_placement();

} // namespace ddp::internal
