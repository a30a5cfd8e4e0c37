// The default process group's placement, for DistributedSampler's defaults.
// See src/data/default_placement.h for why this is a separate part.

#include "data/default_placement.h"

#include <ddp/init.h>

namespace ddp::internal {

DefaultPlacement default_placement() {
  DefaultPlacement placement;
  if (ddp::is_initialized()) {
    const auto group = ddp::default_process_group();
    placement.rank = group->rank();
    placement.num_replicas = group->size();
    placement.from_process_group = true;
  }
  return placement;
}

} // namespace ddp::internal
