#pragma once

// Asking the ranks for their flight recorder dumps before ddprun stops them
// (Note [Dumps at teardown] in teardown_dumps.cpp).

#include <sys/types.h>

#include <chrono>
#include <string>

namespace ddp::launch {

// How long ddprun waits between asking for the dumps and the stop signal.
constexpr std::chrono::milliseconds kDumpWindow{500};

// Sends SIGUSR1 to `pid` when the process catches it, and SIGCONT when the
// process is stopped; returns whether SIGUSR1 was sent. Never throws.
bool ask_for_dump(pid_t pid);

// Where the ranks write their dumps unless their environment differs from
// ddprun's: DDP_FLIGHT_RECORDER_DIR, else $TMPDIR/ddp_flight_recorder (/tmp
// without TMPDIR), as the flight recorder's own dump_directory() in
// src/flight_recorder/flight_recorder.cpp decides (ddprun links no Torch, so
// it cannot call that one; keep the two alike).
std::string dump_directory();

} // namespace ddp::launch
