#pragma once

/// The flight recorder: every process group keeps a ring of its last
/// collectives (DDP_FLIGHT_RECORDER_SIZE, default 2000; 0 turns it off),
/// and each rank writes them to DDP_FLIGHT_RECORDER_DIR/rank_<R>.json when
/// a collective fails, on SIGUSR1, or when asked here. `ddprun --analyze
/// DIR` reads the ranks' files together and names the rank at fault. See
/// docs/debugging.md.

#include <string>

namespace ddp {

/// Writes this process's flight recorder dump now, with `reason` in it;
/// returns the file's path, or an empty string when the recorder is off, no
/// group exists (yet, or any more: the last dump then stays as it was), or
/// the file could not be written (a warning says why).
/// Never throws.
std::string dump_flight_recorder(const std::string& reason = "requested");

} // namespace ddp
