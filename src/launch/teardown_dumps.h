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

// Whether `pid` catches SIGUSR1, that is has a flight recorder that dumps on
// it. Never throws.
bool can_dump(pid_t pid);

// Whether `pid` is stopped (SIGSTOP, SIGTSTP, a debugger). Never throws.
bool is_stopped(pid_t pid);

// Where the ranks write their dumps unless their environment differs from
// ddprun's: flight_recorder::dump_directory(), the job's folder
// (src/flight_recorder/dump_directory.h), which the ranks use too.
std::string dump_directory();

} // namespace ddp::launch
