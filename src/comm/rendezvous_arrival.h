#pragma once

// The first step of every backend's rendezvous through a Store (private
// header; Gloo's and NCCL's engines call it before anything else):
// each rank claims its rank number with `add` (so that two processes
// started with the same RANK are caught), votes for its world size, publishes
// its arrival under "<prefix>arrived/<rank>", and waits for every other
// rank's key. A timeout names the ranks that never arrived; a world size that
// differs names the rank that disagrees.
//
// The store traffic grows linearly with the world: per rank one add, one
// set, one wait on the world's keys and one add to read the votes. Only
// when the votes disagree does a rank read every arrival to name the rank
// that differs. (Reading every arrival always, as this did before, cost
// W x W round trips at the server: about a million at 1024 ranks.)

#include <chrono>
#include <string>

#include <ddp/store/store.h>

namespace ddp::internal {

// `who` is the "[rank R/W]" prefix for messages.
void wait_for_all_ranks(ddp::Store& store, const std::string& prefix, int rank,
                        int size, std::chrono::milliseconds timeout, const std::string& who);

} // namespace ddp::internal
