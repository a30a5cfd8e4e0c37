#pragma once

// What init.cpp (the default group) and subgroups.cpp (new_group) share:
// how the default group was made, so that its subgroups meet through the
// same store with the same backend, and the backend factory itself.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/init.h>
#include <ddp/store/store.h>

namespace ddp::internal {

// The default group and how it was made. A copy: the shared pointers keep
// the group and its store alive while a subgroup is created, even if
// another thread destroys the default group meanwhile.
struct DefaultGroupContext {
  std::shared_ptr<ProcessGroup> group;
  // The store every rank met through; null for MPI's world, which has none.
  std::shared_ptr<Store> store;
  // What init_process_group passed to the backend (Gloo picks the network
  // interface that reaches it); empty when it had none.
  std::string master_addr;
  // The backend asked for, DDP_BACKEND resolved: kAuto still means the
  // automatic choice (Gloo, or cpu:gloo,cuda:nccl with NCCL and a GPU).
  Backend backend = Backend::kAuto;
};

// The default group's context. Throws c10::Error naming `op` when there
// is no default group.
DefaultGroupContext default_group_context(const char* op);

// A group of `backend` (kAuto: the automatic choice, not DDP_BACKEND)
// over `store`, as init_process_group makes it; for kMpi, a communicator
// of MPI_COMM_WORLD's `mpi_ranks` (all of them when empty), with no store.
std::shared_ptr<ProcessGroup> create_backend_group(
    std::shared_ptr<Store> store,
    int rank,
    int world_size,
    const InitOptions& options,
    const std::string& master_addr,
    const std::vector<int>& mpi_ranks);

// Defined in subgroups.cpp. Waits for each subgroup's queued work (each by
// its deadline) and drops the registry's references to them. Called by
// destroy_process_group() before it ends the default group, whose store
// the subgroups used.
void destroy_subgroups() noexcept;

// Defined in subgroups.cpp. The global ranks of `group` when new_group made
// it (and it is not destroyed yet); empty otherwise (the default group, a
// group made another way). For the plan report (Note [Plan report]).
std::vector<int> subgroup_global_ranks(const ProcessGroup* group);

} // namespace ddp::internal
