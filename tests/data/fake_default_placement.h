#pragma once

// A stand-in for the default process group in the sampler's unit tests: the
// test binary links tests/data/fake_default_placement.cpp instead of
// ddp_data_pg, so that DistributedSampler's defaults can be tested without
// starting a process group. The real lookup is tested in
// distributed_sampler_group_test.cpp.

#include "data/default_placement.h"

namespace ddp::testing {

// What the fake internal::default_placement() returns from now on.
// Default: rank 0 of 1, no process group.
void set_fake_default_placement(const internal::DefaultPlacement& placement);

} // namespace ddp::testing
