// Subgroups of the default group: new_group(ranks), new_subgroups, the
// rank translations and the registry that destroy_process_group() empties.
//
// How it works. Every process numbers its new_group calls 1, 2, ...; since
// every rank makes the same calls in the same order, a *group number* names
// the same group on every rank, and is never reused (not even across
// destroy_process_group and init_process_group), so that no two groups of
// one job ever share store keys.
//
// A member writes the sorted ranks it was given under
// ddp/new_group/<n>/members/<global rank> in the default group's store and
// waits, up to the group's timeout, for every other member's entry. A
// different list, or a member missing at the deadline, is an error naming
// the group, raised before any backend rendezvous that could otherwise hang
// or pair the wrong ranks. The member then creates the backend's group as
// init_process_group does, over the same store, with the group name
// "subgroup_<n>" under which the backend keeps its rendezvous keys, and
// with its index in the sorted ranks as its rank.
//
// MPI has no store: every rank of the default group, member or not,
// compares (group number, ranks) with one allreduce on the default group
// (bounded by the timeout), and the members then make the communicator
// (MPI_Comm_create_group, a collective of the members only).
//
// Note [Local synchronization]
// With use_local_synchronization only the members call: a group number
// would then differ between members and non-members, so such a call takes
// none. Its name is local_<hash of the ranks>_<k>, k counting this
// process's local groups of the same ranks (1, 2, ...): the members, making
// the same calls for their own groups in the same order, count alike. The
// members meet in the store under that name as above.
//
// A non-member writes nothing and waits for nothing (MPI's check aside):
// it gets a NonMemberGroup, whose rank() is -1 and whose every operation
// throws, as PyTorch's GroupMember.NON_GROUP_MEMBER.
//
// The registry keeps every group that new_group returned, so that its
// ranks can be translated (global_rank, group_rank) and so that
// destroy_process_group() can end them before the default group whose
// store they use, as torch.distributed's world does.

#include <ddp/group.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <ddp/comm/error.h>

#include "comm/default_group.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp {

namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

// The handle of a process outside the group. Thread-safety: immutable.
class NonMemberGroup final : public ProcessGroup {
 public:
  NonMemberGroup(std::string label, std::vector<int> ranks, int global_rank, int world_size,
                 std::chrono::milliseconds timeout)
      : ProcessGroup(NonMemberTag{}, static_cast<int>(ranks.size()), timeout),
        label_(std::move(label)),
        ranks_(std::move(ranks)),
        global_rank_(global_rank),
        world_size_(world_size) {}

  std::string backend_name() const override {
    return "non-member";
  }
  const std::vector<int>& ranks() const {
    return ranks_;
  }

  std::shared_ptr<Work> allreduce(const at::Tensor&, const AllreduceOptions&) override {
    refuse("allreduce");
  }
  std::shared_ptr<Work> allreduce_coalesced(const std::vector<at::Tensor>&,
                                            const AllreduceOptions&) override {
    refuse("allreduce_coalesced");
  }
  std::shared_ptr<Work> broadcast(const at::Tensor&, const BroadcastOptions&) override {
    refuse("broadcast");
  }
  std::shared_ptr<Work> reduce(const at::Tensor&, const ReduceOptions&) override {
    refuse("reduce");
  }
  std::shared_ptr<Work> allgather(const std::vector<at::Tensor>&, const at::Tensor&,
                                  const AllgatherOptions&) override {
    refuse("allgather");
  }
  std::shared_ptr<Work> allgather_into_tensor(const at::Tensor&, const at::Tensor&,
                                              const AllgatherOptions&) override {
    refuse("allgather_into_tensor");
  }
  std::shared_ptr<Work> gather(const std::vector<at::Tensor>&, const at::Tensor&,
                               const GatherOptions&) override {
    refuse("gather");
  }
  std::shared_ptr<Work> scatter(const at::Tensor&, const std::vector<at::Tensor>&,
                                const ScatterOptions&) override {
    refuse("scatter");
  }
  std::shared_ptr<Work> reduce_scatter(const at::Tensor&, const std::vector<at::Tensor>&,
                                       const ReduceScatterOptions&) override {
    refuse("reduce_scatter");
  }
  using ProcessGroup::alltoall;
  std::shared_ptr<Work> alltoall(const at::Tensor&, const at::Tensor&,
                                 const AlltoallOptions&) override {
    refuse("alltoall");
  }
  std::shared_ptr<Work> barrier(const BarrierOptions&) override {
    refuse("barrier");
  }
  std::shared_ptr<Work> send(const at::Tensor&, int, const PointToPointOptions&) override {
    refuse("send");
  }
  std::shared_ptr<Work> recv(const at::Tensor&, int, const PointToPointOptions&) override {
    refuse("recv");
  }

 private:
  [[noreturn]] void refuse(const char* op) const {
    internal::throw_check_error(
        __func__, __FILE__, __LINE__,
        c10::str("[rank ", global_rank_, "/", world_size_, "] ", op,
                 ": this rank is not a member of group ", label_, " (ranks ", join_ranks(ranks_),
                 "); only its members may use it (check ddp::is_member(group) first)"));
  }

  const std::string label_; // "3", or "local_<hash>_<k>"
  const std::vector<int> ranks_;
  const int global_rank_; // in the default group, for messages
  const int world_size_;
};

// One group that new_group made.
struct SubgroupRecord {
  std::string label; // the group number, or local_<hash>_<k>
  std::vector<int> ranks; // sorted global ranks
  std::shared_ptr<ProcessGroup> group;
};

struct Registry {
  std::mutex mutex;
  int last_id = 0;                     // guarded by mutex; only goes up
  std::map<std::vector<int>, int> local_made; // guarded by mutex; use_local_synchronization groups per ranks
  std::vector<SubgroupRecord> records; // guarded by mutex
};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::string rank_prefix_of(const internal::DefaultGroupContext& context) {
  return c10::str("[rank ", context.group->rank(), "/", context.group->size(), "]");
}

// A 62-bit fingerprint of (group number, ranks), so that its negation fits
// an int64 too.
int64_t fingerprint(int id, const std::vector<int>& ranks) {
  uint64_t hash = 1469598103934665603ULL; // FNV-1a
  const auto mix = [&hash](uint64_t value) {
    hash ^= value;
    hash *= 1099511628211ULL;
  };
  mix(static_cast<uint64_t>(id));
  mix(ranks.size());
  for (int r : ranks) {
    mix(static_cast<uint64_t>(r));
  }
  return static_cast<int64_t>(hash >> 2);
}

// The members' check through the store; see the file comment.
void agree_through_store(const internal::DefaultGroupContext& context, const std::string& id,
                         const std::vector<int>& ranks, std::chrono::milliseconds timeout) {
  const std::string who = rank_prefix_of(context) + " new_group";
  const std::string text = join_ranks(ranks);
  const auto key = [&id](int rank) { return c10::str("ddp/new_group/", id, "/members/", rank); };
  context.store->set(key(context.group->rank()), text);
  std::vector<std::string> keys;
  for (int r : ranks) {
    keys.push_back(key(r));
  }
  try {
    context.store->wait(keys, timeout);
  } catch (const TimeoutError& e) {
    std::vector<int> missing;
    for (int r : ranks) {
      try {
        if (!context.store->check({key(r)})) {
          missing.push_back(r);
        }
      } catch (const std::exception&) {
        missing.push_back(r);
      }
    }
    throw TimeoutError(c10::str(
        who, ": group ", id, " (ranks ", text, "): member rank(s) ", join_ranks(missing),
        " did not reach their new_group call number ", id, " within ", timeout.count(),
        " ms; every rank must call new_group the same number of times, in the same order. "
        "The store said: ",
        e.what()));
  }
  for (int r : ranks) {
    const std::string theirs = context.store->get_string(key(r));
    DDP_CHECK(theirs == text, who, ": group ", id, ": rank ", r,
              " passed other ranks to its new_group call number ", id, " (ranks ", theirs,
              ") than this rank (ranks ", text,
              "); every rank must make the same new_group calls in the same order");
  }
}

// MPI's check: one allreduce of the default group; see the file comment.
void agree_through_default_group(const internal::DefaultGroupContext& context, int id,
                                 const std::vector<int>& ranks, std::chrono::milliseconds timeout) {
  const int64_t mine = fingerprint(id, ranks);
  auto values = at::tensor({mine, -mine}, at::kLong);
  AllreduceOptions options;
  options.op = ReduceOp::kMax;
  options.timeout = timeout;
  context.group->allreduce(values, options)->wait();
  const int64_t highest = values[0].item<int64_t>();
  const int64_t lowest = -values[1].item<int64_t>();
  DDP_CHECK(highest == mine && lowest == mine, rank_prefix_of(context), " new_group: group ", id,
            " (ranks ", join_ranks(ranks),
            " on this rank): the ranks of the default group passed different ranks to their "
            "new_group call number ",
            id, "; every rank must make the same new_group calls in the same order");
}

// `group`'s sorted global ranks; throws when it is neither the default
// group nor one of new_group's.
std::vector<int> ranks_of(const std::shared_ptr<ProcessGroup>& group, const char* op) {
  DDP_CHECK(group != nullptr, op, ": the group is null");
  if (const auto* outside = dynamic_cast<const NonMemberGroup*>(group.get())) {
    return outside->ranks();
  }
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (const auto& record : reg.records) {
      if (record.group == group) {
        return record.ranks;
      }
    }
  }
  const auto context = internal::default_group_context(op);
  DDP_CHECK(group == context.group, rank_prefix_of(context), " ", op,
            ": the group is neither the default group nor one that ddp::new_group made (or it "
            "was destroyed), so its ranks are unknown");
  std::vector<int> all(static_cast<size_t>(context.group->size()));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

} // namespace

std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, const NewGroupOptions& options) {
  const auto context = internal::default_group_context("new_group");
  const int world_size = context.group->size();
  const std::string who = rank_prefix_of(context) + " new_group";
  DDP_CHECK(!ranks.empty(), who,
            ": ranks is empty; pass the global ranks of the group's members, e.g. {0, 1}");
  const std::vector<int> given = ranks;
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    DDP_CHECK(ranks[i] >= 0 && ranks[i] < world_size, who, ": rank ", ranks[i],
              " is outside the default group's ranks [0, ", world_size, ") (got ranks ",
              join_ranks(given), ")");
    DDP_CHECK(i == 0 || ranks[i - 1] != ranks[i], who, ": rank ", ranks[i],
              " appears more than once (got ranks ", join_ranks(given), ")");
  }
  const Backend backend = options.backend() == Backend::kAuto ? context.backend : options.backend();
  const auto timeout =
      options.timeout() == kUseGroupTimeout ? context.group->timeout() : options.timeout();
  DDP_CHECK(timeout.count() > 0, who, ": timeout must be positive or kUseGroupTimeout (got ",
            timeout.count(), " ms)");
  DDP_CHECK(backend == Backend::kMpi || context.store != nullptr, who, ": a ", to_string(backend),
            " subgroup meets through the default group's store, and this default group (",
            context.group->backend_name(),
            ") has none; use NewGroupOptions().backend(ddp::Backend::kMpi), or leave the "
            "backend as kAuto");

  const int global = context.group->rank();
  const auto position = std::find(ranks.begin(), ranks.end(), global);
  const bool member = position != ranks.end();
  const bool local = options.use_local_synchronization();
  DDP_CHECK(!local || backend != Backend::kMpi, who,
            ": use_local_synchronization is not offered on MPI: the check that the members passed the "
            "same ranks is a collective of the whole default group there; call new_group on every rank");
  std::string id;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    if (!local) {
      id = std::to_string(++reg.last_id);
    } else {
      // Note [Local synchronization]: the members, and only they, count the
      // groups of these ranks alike, so the name is the same on each.
      const int made = member ? ++reg.local_made[ranks] : 0;
      id = c10::str("local_", std::hex, static_cast<uint64_t>(fingerprint(0, ranks)), std::dec, "_", made);
    }
  }

  if (backend == Backend::kMpi) {
    agree_through_default_group(context, std::stoi(id), ranks, timeout);
  } else if (member && backend != Backend::kFake) { // a fake group's other ranks do not exist
    agree_through_store(context, id, ranks, timeout);
  }

  std::shared_ptr<ProcessGroup> group;
  if (member) {
    const int group_rank = static_cast<int>(position - ranks.begin());
    group = internal::create_backend_group(
        context.store, group_rank, static_cast<int>(ranks.size()),
        InitOptions().backend(backend).timeout(timeout).group_name(c10::str("subgroup_", id)),
        context.master_addr, backend == Backend::kMpi ? ranks : std::vector<int>{});
  } else {
    group = std::make_shared<NonMemberGroup>(local ? "local (ranks " + join_ranks(ranks) + ")" : id, ranks,
                                             global, world_size, timeout);
  }
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.records.push_back(SubgroupRecord{id, ranks, group});
  return group;
}

Subgroups new_subgroups(int group_size, const NewGroupOptions& options) {
  const auto context = internal::default_group_context("new_subgroups");
  const int world_size = context.group->size();
  DDP_CHECK(group_size > 0 && world_size % group_size == 0, rank_prefix_of(context),
            " new_subgroups: group_size must be positive and divide the world size ", world_size,
            " (got ", group_size, ")");
  Subgroups result;
  for (int first = 0; first < world_size; first += group_size) {
    std::vector<int> ranks(static_cast<size_t>(group_size));
    std::iota(ranks.begin(), ranks.end(), first);
    result.all.push_back(new_group(std::move(ranks), options));
    if (context.group->rank() >= first && context.group->rank() < first + group_size) {
      result.mine = result.all.back();
    }
  }
  return result;
}

Subgroups new_subgroups_by_enumeration(const std::vector<std::vector<int>>& ranks_per_subgroup,
                                       const NewGroupOptions& options) {
  const auto context = internal::default_group_context("new_subgroups_by_enumeration");
  const std::string who = rank_prefix_of(context) + " new_subgroups_by_enumeration";
  DDP_CHECK(!ranks_per_subgroup.empty(), who, ": ranks_per_subgroup is empty; expected at least one list of ranks");
  // Every rank checks every list before any group is made, so that all fail
  // alike and no group number is taken.
  std::map<int, size_t> list_of_rank;
  for (size_t k = 0; k < ranks_per_subgroup.size(); ++k) {
    for (const int rank : ranks_per_subgroup[k]) {
      const auto [at, inserted] = list_of_rank.emplace(rank, k);
      DDP_CHECK(inserted || at->second == k, who, ": rank ", rank, " appears in both subgroup ", at->second, " (",
                c10::Join(", ", ranks_per_subgroup[at->second]), ") and subgroup ", k, " (",
                c10::Join(", ", ranks_per_subgroup[k]), "); expected each rank in one subgroup at most");
    }
  }
  Subgroups result;
  const int me = context.group->rank();
  for (const auto& ranks : ranks_per_subgroup) {
    result.all.push_back(new_group(ranks, options));
    if (std::find(ranks.begin(), ranks.end(), me) != ranks.end()) {
      result.mine = result.all.back();
    }
  }
  return result;
}

bool is_member(const std::shared_ptr<ProcessGroup>& group) {
  return group != nullptr && group->rank() >= 0;
}

int global_rank(const std::shared_ptr<ProcessGroup>& group, int rank_in_group) {
  const auto ranks = ranks_of(group, "global_rank");
  DDP_CHECK(rank_in_group >= 0 && rank_in_group < static_cast<int>(ranks.size()),
            "global_rank: group rank ", rank_in_group, " is outside the group's ranks [0, ",
            ranks.size(), ")");
  return ranks[static_cast<size_t>(rank_in_group)];
}

int group_rank(const std::shared_ptr<ProcessGroup>& group, int global) {
  const auto ranks = ranks_of(group, "group_rank");
  const auto it = std::find(ranks.begin(), ranks.end(), global);
  DDP_CHECK(it != ranks.end(), "group_rank: global rank ", global,
            " is not a member of the group (ranks ", join_ranks(ranks), ")");
  return static_cast<int>(it - ranks.begin());
}

std::vector<int> group_ranks(const std::shared_ptr<ProcessGroup>& group) {
  return ranks_of(group, "group_ranks");
}

void destroy_process_group(const std::shared_ptr<ProcessGroup>& group) {
  DDP_CHECK(group != nullptr, "destroy_process_group: the group is null");
  DDP_CHECK(!is_initialized() || group != default_process_group(),
            "destroy_process_group(group): this is the default group; call "
            "ddp::destroy_process_group() with no argument to end it (and every subgroup)");
  std::shared_ptr<ProcessGroup> found;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = std::find_if(reg.records.begin(), reg.records.end(),
                           [&group](const SubgroupRecord& r) { return r.group == group; });
    if (it == reg.records.end()) {
      return;
    }
    found = std::move(it->group);
    reg.records.erase(it);
  }
  found->wait_for_pending_work();
}

namespace internal {

std::vector<int> subgroup_global_ranks(const ProcessGroup* group) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (const auto& record : reg.records) {
    if (record.group.get() == group) {
      return record.ranks;
    }
  }
  return {};
}

void destroy_subgroups() noexcept {
  std::vector<SubgroupRecord> records;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    records.swap(reg.records);
  }
  // Newest first: the reverse of the order they were made in.
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    try {
      it->group->wait_for_pending_work();
    } catch (const std::exception& e) {
      log_warning(c10::str("destroy_process_group: group ", it->label, " (ranks ",
                           join_ranks(it->ranks), "): ", error_message(e)));
    }
    it->group.reset();
  }
}

} // namespace internal

} // namespace ddp
