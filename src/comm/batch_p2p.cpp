#include <ddp/comm/batch_p2p.h>

#include <ddp/group.h>
#include <ddp/init.h>

#include <c10/util/StringUtil.h>

#include <algorithm>

#include "internal/check.h"

namespace ddp {

P2POp P2POp::isend(at::Tensor tensor, int peer, std::shared_ptr<ProcessGroup> group, int tag) {
  return P2POp{true, std::move(tensor), peer, std::move(group), tag};
}

P2POp P2POp::irecv(at::Tensor tensor, int peer, std::shared_ptr<ProcessGroup> group, int tag) {
  return P2POp{false, std::move(tensor), peer, std::move(group), tag};
}

std::vector<std::shared_ptr<Work>> batch_isend_irecv(const std::vector<P2POp>& ops) {
  const auto group_of = [](const P2POp& op) { return op.group ? op.group : default_process_group(); };
  const auto group = ops.empty() ? default_process_group() : group_of(ops.front());
  DDP_CHECK(group, "batch_isend_irecv: no process group; call ddp::init_process_group() first or give each "
                   "P2POp a group");
  const std::string who = c10::str("[rank ", group->rank(), "/", group->size(), "] batch_isend_irecv");
  DDP_CHECK(!ops.empty(), who, ": the list of P2POps is empty; expected at least one");
  DDP_CHECK(is_member(group), who, ": this process is not a member of the ops' group");
  std::vector<PointToPointOp> local;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    DDP_CHECK(group_of(op) == group, who, ": ops[", i, "] uses another group than ops[0]; every op of a "
              "batch must use one group");
    const auto ranks = group_ranks(group);
    const auto at = std::find(ranks.begin(), ranks.end(), op.peer);
    DDP_CHECK(at != ranks.end(), who, ": ops[", i, "] (", op.is_send ? "isend" : "irecv", ") names peer ",
              op.peer, ", which is not a rank of the group (global ranks ", c10::Join(", ", ranks),
              "); P2POp's peer is a global rank");
    local.push_back(PointToPointOp{op.is_send, op.tensor, static_cast<int>(at - ranks.begin()), op.tag});
  }
  return group->batch_point_to_point(local);
}

} // namespace ddp
