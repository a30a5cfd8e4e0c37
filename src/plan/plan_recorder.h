#pragma once

// What the plan report (include/ddp/plan.h) is fed with (private header):
// the default group's creation and destruction, the steps, and the bytes
// each fake operation would have sent. See Note [Plan report].

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::internal {

// The default group is made: this process is `rank` of `world_size` on
// `backend`. With the fake backend or DDP_PLAN_REPORT set, tensor memory
// is counted from here on.
void plan_group_created(int rank, int world_size, const std::string& backend);
// A DistributedDataParallel or FullyShardedDataParallel forward with
// gradients begins: a new step.
void plan_begin_step();
// A fake group's operation `op`, on a tensor of `tensor_bytes` here, would
// have sent `bytes`; `group` identifies the group, whose world ranks are
// `members`.
void plan_count_sent(const char* op, int64_t bytes, int64_t tensor_bytes, const void* group,
                     const std::vector<int>& members);
// destroy_process_group: writes the report when DDP_PLAN_REPORT is set.
void plan_group_destroyed();

} // namespace ddp::internal
