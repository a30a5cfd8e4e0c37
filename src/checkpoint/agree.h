#pragma once

// Steps of a collective save or load that every rank must pass together
// (private header): a rank that fails makes every rank fail, naming it,
// instead of leaving the others waiting at the next collective.

#include <functional>
#include <memory>
#include <string>

#include <ddp/comm/process_group.h>

namespace ddp::checkpoint {

// Runs `body` here, then every rank of `group` learns every rank's outcome
// (a collective). When any rank failed, every rank throws c10::Error
// starting with `prefix`, naming the first rank that failed and its error.
void all_ranks_agree(const std::shared_ptr<ProcessGroup>& group, const std::string& prefix,
                     const std::function<void()>& body);

// "[rank R/W] op".
std::string who(const ProcessGroup& group, const std::string& op);

} // namespace ddp::checkpoint
