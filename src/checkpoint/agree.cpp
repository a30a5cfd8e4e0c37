#include "checkpoint/agree.h"

#include <c10/util/Exception.h>

#include <vector>

#include <ddp/comm/error.h>
#include <ddp/comm/object_collectives.h>

#include "comm/collective_label.h"
#include "internal/check.h"

namespace ddp::checkpoint {

std::string who(const ProcessGroup& group, const std::string& op) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] ", op);
}

void all_ranks_agree(const std::shared_ptr<ProcessGroup>& group, const std::string& prefix,
                     const std::function<void()>& body) {
  std::string error;
  try {
    body();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  std::vector<std::string> outcomes; // "" for success, "!" + the error
  {
    internal::CollectiveLabel label(prefix.substr(prefix.find("] ") == std::string::npos ? 0 : prefix.find("] ") + 2));
    all_gather_bytes(outcomes, error.empty() ? std::string() : "!" + error, group);
  }
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (!outcomes[r].empty()) {
      const std::string text = outcomes[r].substr(1);
      DDP_CHECK(false, prefix, ": ", static_cast<int>(r) == group->rank() ? "this rank" : c10::str("rank ", r),
                " failed: ", text);
    }
  }
}

} // namespace ddp::checkpoint
