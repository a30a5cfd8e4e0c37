#include "comm/rendezvous_arrival.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <ddp/comm/error.h>

#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"

namespace ddp::internal {

namespace {
std::string format_ranks(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text + "]";
}

// DDP_RENDEZVOUS_PROGRESS_S, in milliseconds; 0: off.
std::chrono::milliseconds progress_interval(int rank, int size) {
  const auto text = env_get(kEnvRendezvousProgress).value_or("10");
  char* end = nullptr;
  const long long seconds = std::strtoll(text.c_str(), &end, 10);
  DDP_CHECK(!text.empty() && *end == '\0' && seconds >= 0 && seconds <= 86400, "[rank ", rank, "/",
            size, "] init_process_group: ", kEnvRendezvousProgress.name,
            " must be a whole number of seconds in [0, 86400] (0: off), got '", text, "'");
  return std::chrono::seconds(seconds);
}

// The ranks whose arrival key is not set yet.
std::vector<int> missing_ranks(ddp::Store& store, const std::vector<std::string>& keys) {
  std::vector<int> missing;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (!store.check({keys[r]})) {
      missing.push_back(static_cast<int>(r));
    }
  }
  return missing;
}

// "ranks 1, 3" / "rank 2".
std::string naming(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}
} // namespace

void wait_for_all_ranks(ddp::Store& store, const std::string& prefix, int rank, int size,
                        std::chrono::milliseconds timeout, const std::string& who) {
  const int64_t claims = store.add(prefix + "claim/" + std::to_string(rank), 1);
  DDP_CHECK(claims == 1, who, " init_process_group: rank ", rank,
            " was claimed by ", claims, " processes; each process needs its own RANK in [0, ",
            size, ")");
  // The vote comes before the arrival, so that once every arrival is seen,
  // every vote is counted.
  const std::string votes_key = prefix + "size_votes/" + std::to_string(size);
  store.add(votes_key, 1);
  store.set(prefix + "arrived/" + std::to_string(rank), std::to_string(size));
  // Note [One key for the whole world]: the n-th rank to count its arrival
  // sets "arrivals_reached/<n>", and each rank waits for the key of its own
  // world size alone.
  const int64_t arrivals = store.add(prefix + "arrivals", 1);
  store.set(prefix + "arrivals_reached/" + std::to_string(arrivals), "1");
  const std::string all_arrived = prefix + "arrivals_reached/" + std::to_string(size);

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    keys.push_back(prefix + "arrived/" + std::to_string(r));
  }
  // Ranks other than 0 give up a little before rank 0 does: rank 0 usually
  // serves the store, and once it has given up and exited the others can no
  // longer ask it which ranks are missing.
  const auto margin = rank == 0 ? std::chrono::milliseconds(0)
                                : std::min<std::chrono::milliseconds>(timeout / 10, std::chrono::seconds(5));
  // Note [Rendezvous progress]: the wait goes in slices of the progress
  // interval, and after each one this rank says whom it still waits for, so
  // that a start-up that hangs on a missing rank is not silent for the
  // whole timeout (30 minutes by default).
  const auto deadline = timeout - margin;
  const auto interval = progress_interval(rank, size);
  std::chrono::milliseconds waited{0};
  const auto seconds = [](std::chrono::milliseconds ms) { return (ms.count() + 500) / 1000; };
  try {
    for (;;) {
      const auto slice = interval.count() > 0 ? std::min(interval, deadline - waited) : deadline - waited;
      try {
        store.wait({all_arrived}, slice);
        break;
      } catch (const TimeoutError&) {
        waited += slice;
        const auto missing = missing_ranks(store, keys);
        if (missing.empty()) {
          break; // they all came in just after the slice ended
        }
        if (interval.count() > 0) {
          log_info(c10::str("[rank ", rank, "/", size, "] init_process_group: waiting for ",
                               naming(missing), " to join (", seconds(waited), " s of ",
                               seconds(deadline), " s)", waited >= deadline ? ": giving up" : ""));
        }
        if (waited >= deadline) {
          throw;
        }
      }
    }
  } catch (const IoError& e) {
    if (rank == 0) {
      throw;
    }
    throw IoError(c10::str(
        who, " init_process_group: the store went away during rendezvous, before every rank had "
        "arrived; rank 0 serves it, so rank 0 probably timed out waiting for a missing rank or "
        "failed (its own error names which). The store said: ", e.what()));
  } catch (const TimeoutError&) {
    const auto missing = missing_ranks(store, keys);
    throw TimeoutError(c10::str(
        who, " init_process_group: rendezvous timed out after ", deadline.count(),
        " ms; rank(s) ", format_ranks(missing), " of ", size,
        " never arrived. Check that every rank was started with the same MASTER_ADDR, "
        "MASTER_PORT and WORLD_SIZE, and that none of them failed before joining."));
  }
  if (store.add(votes_key, 0) == size) {
    return; // every rank voted for this world size
  }
  // Among the first `size` ranks to arrive, one voted for another world
  // size: name it. Ranks of this world that have not arrived (there are
  // more processes than this rank's world size) are skipped, since reading
  // their keys would wait.
  for (int r = 0; r < size; ++r) {
    if (!store.check({keys[r]})) {
      continue;
    }
    const auto value = store.get(keys[r]);
    const std::string their_size(value.begin(), value.end());
    DDP_CHECK(their_size == std::to_string(size), who, " init_process_group: rank ", r,
              " was started with world size ", their_size, ", this rank with ", size,
              "; every rank needs the same WORLD_SIZE");
  }
  DDP_CHECK(false, who, " init_process_group: the first ", size,
            " ranks to arrive were not all started with world size ", size,
            " as this rank was: a rank numbered ", size,
            " or above arrived with another WORLD_SIZE; every rank needs the same WORLD_SIZE");
}


} // namespace ddp::internal
