#pragma once

/// Subgroups of the default process group: `new_group(ranks)`, as
/// torch.distributed's `new_group`, `new_subgroups` and
/// `new_subgroups_by_enumeration`, and the rank translations that go with
/// them (`global_rank`, `group_rank`, `group_ranks`).
///
/// Thread-safety: every function may be called from any thread, but the
/// `new_group` calls of a process are numbered in the order they start, so
/// a program that makes them from several threads must order those threads
/// itself, as it does for collectives.

#include <chrono>
#include <memory>
#include <vector>

#include <torch/arg.h>

#include <ddp/comm/process_group.h>
#include <ddp/comm/types.h>
#include <ddp/init.h>

namespace ddp {

/// Options of `new_group` and `new_subgroups`.
/// Example:
/// `ddp::new_group({0, 1}, ddp::NewGroupOptions().timeout(std::chrono::minutes(5)))`
struct NewGroupOptions {
  /// The subgroup's backend. Backend::kAuto means the default group's (the
  /// backend `init_process_group` resolved, DDP_BACKEND included), as
  /// PyTorch's `backend=None`. Default: Backend::kAuto.
  TORCH_ARG(Backend, backend) = Backend::kAuto;
  /// Deadline of the subgroup's creation and the default deadline of its
  /// collectives. kUseGroupTimeout means the default group's. Default:
  /// kUseGroupTimeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = kUseGroupTimeout;
  /// Only the members call `new_group` (PyTorch's
  /// `use_local_synchronization=True`): the call takes no group number, and
  /// the members meet under a name made from the ranks and how many such
  /// groups of the same ranks this process has made; a non-member that calls
  /// gets its handle without waiting for anyone. Gloo and NCCL; refused on
  /// MPI, whose check that the members agree is a collective of the
  /// default group. Default: false.
  TORCH_ARG(bool, use_local_synchronization) = false;
};

/// Creates a process group of the default group's ranks `ranks` (global
/// ranks, in any order; the group orders them). Every process of the
/// default group must call `new_group` the same number of times in the same
/// order with the same `ranks`, members or not, as in PyTorch: each call
/// takes the next group number of this process (1, 2, ...; numbers are never
/// reused, not even after `destroy_process_group()`), which names the group
/// in the store and in errors.
///
/// A member gets a group of the chosen backend whose rank() is its index in
/// the sorted `ranks` (group rank r is global rank sorted(ranks)[r]), met
/// through the default group's store under the group's own keys. With the
/// MPI backend the group is a communicator of MPI_COMM_WORLD's ranks
/// (MPI_Comm_create_group) and the call is also a collective of the default
/// group. A process outside `ranks` gets (at once, but for MPI's check) a
/// handle whose rank() is -1 and `is_member()` false, and on which every
/// operation throws `c10::Error` ("[rank 3/4] allreduce: this rank is not a
/// member of group 1 (ranks 0, 1)"). Either way the default group's registry
/// keeps the group until `destroy_process_group()` (see that function).
///
/// Throws `c10::Error` when there is no default group, or `ranks` is empty,
/// holds a rank twice or a rank outside [0, world size). Members compare
/// their calls: when another member passed different ranks for the same
/// group number, throws `c10::Error` naming the group and both lists; when a
/// member has not made the call within the timeout, throws `TimeoutError`
/// naming the group and the ranks that are missing.
std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, const NewGroupOptions& options = {});

/// The groups that `new_subgroups` or `new_subgroups_by_enumeration` made:
/// every one of them, in order, and the one this process belongs to.
struct Subgroups {
  /// This process's group: for `new_subgroups`, the one of global ranks
  /// [k * group_size, (k + 1) * group_size) that holds it; for
  /// `new_subgroups_by_enumeration`, the one whose list names it, or
  /// nullptr when none does (PyTorch's None).
  std::shared_ptr<ProcessGroup> mine;
  /// Every group, in the order made (`new_subgroups`: group k holds global
  /// ranks [k * group_size, (k + 1) * group_size)); non-member handles for
  /// the groups this process is not in.
  std::vector<std::shared_ptr<ProcessGroup>> all;
};

/// Splits the default group into world_size / group_size groups of
/// consecutive ranks, as PyTorch's `new_subgroups(group_size)`: calls
/// `new_group` once per group, in order. Throws `c10::Error` when
/// `group_size` is not positive or does not divide the world size.
Subgroups new_subgroups(int group_size, const NewGroupOptions& options = {});

/// Makes one group of each list of global ranks in `ranks_per_subgroup`, in
/// order, as PyTorch's `new_subgroups_by_enumeration`: calls `new_group`
/// once per list, so every process of the default group must make the call
/// with the same lists. The lists need not cover every rank. Throws
/// `c10::Error`, before any group is made (PyTorch makes the groups before
/// the one that fails), when `ranks_per_subgroup` is empty or a rank appears
/// in two lists (naming both); each list is then checked as `new_group`
/// checks its `ranks`.
/// Example: `auto split = ddp::new_subgroups_by_enumeration({{0, 2}, {1, 3}});`
/// then `split.mine->allreduce(t)` sums over ranks {0, 2} or {1, 3}.
Subgroups new_subgroups_by_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup,
                                       const NewGroupOptions& options = {});

/// Whether this process belongs to `group`: false for the handle that
/// `new_group` gives a non-member (and for a null pointer).
bool is_member(const std::shared_ptr<ProcessGroup>& group);

/// The global rank (the default group's) of `group`'s rank `rank_in_group`,
/// as PyTorch's `get_global_rank`. `group` is the default group or one that
/// `new_group` made (non-member handles included). Throws `c10::Error`
/// otherwise, or when `rank_in_group` is outside [0, group->size()).
int global_rank(const std::shared_ptr<ProcessGroup>& group, int rank_in_group);

/// The rank in `group` of global rank `global`, as PyTorch's
/// `get_group_rank`. Throws `c10::Error` when `global` is not one of
/// `group`'s ranks, or as `global_rank`.
int group_rank(const std::shared_ptr<ProcessGroup>& group, int global);

/// The global ranks of `group`, in group-rank order (sorted), as PyTorch's
/// `get_process_group_ranks`. The default group's are 0 .. world size - 1.
std::vector<int> group_ranks(const std::shared_ptr<ProcessGroup>& group);

/// Forgets one group that `new_group` made: waits (each by its deadline) for
/// the work queued on it and drops the registry's reference, so that the
/// group closes once the caller's references are gone too. A no-op for a
/// group already destroyed. To end every group at once, call
/// `destroy_process_group()`, which does this for every subgroup before it
/// ends the default group. Throws `c10::Error` for the default group.
void destroy_process_group(const std::shared_ptr<ProcessGroup>& group);

} // namespace ddp
