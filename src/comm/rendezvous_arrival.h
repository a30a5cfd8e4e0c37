#pragma once

// The first step of every backend's rendezvous through a Store (private
// header; Gloo's and NCCL's engines call it before anything else):
// each rank claims its rank number with `add` (so that two processes
// started with the same RANK are caught), votes for its world size, publishes
// its arrival under "<prefix>arrived/<rank>", and waits for every other
// rank's key. A timeout names the ranks that never arrived; a world size that
// differs names the rank that disagrees.
//
// The store traffic grows linearly with the world: per rank two adds, one
// set, one wait on a single key and one add to read the votes. Only when
// the votes disagree, or when the wait times out, does a rank read every
// arrival, to name the rank that differs or the ranks that never came.
// (Reading every arrival always, as this did before, cost W x W round trips
// at the server: about a million at 1024 ranks.)
//
// Note [One key for the whole world]: each rank adds one to an arrival
// count after publishing its arrival and sets "<prefix>arrivals_reached/<n>"
// with n the count its add returned; a rank of world size W waits for
// "arrivals_reached/W" alone (the pattern of torch.distributed.elastic's
// store barrier, with one key per count so that ranks started with
// different world sizes are each released when their own count is reached
// and find the disagreement in the votes, as before). Waiting for
// the W arrival keys themselves, as before, parked W waits of W key names
// each at the server: about 95 MB at 1024 ranks, where PyTorch's server
// used 6.

#include <chrono>
#include <string>

#include <ddp/store/store.h>

namespace ddp::internal {

// `who` is the "[rank R/W]" prefix for messages.
void wait_for_all_ranks(ddp::Store& store, const std::string& prefix, int rank,
                        int size, std::chrono::milliseconds timeout, const std::string& who);

} // namespace ddp::internal
