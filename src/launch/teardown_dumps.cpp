// Note [Dumps at teardown]
// When ddprun stops a job, because a rank failed or because it was asked to
// stop, the ranks still running hold in their flight recorders (Note [Flight
// recorder] in src/flight_recorder/flight_recorder.cpp) the history that
// explains the failure: which collective each one waits in. So before the
// stop signal, ddprun sends SIGUSR1 to every running rank whose process
// catches it, which the flight recorder's handler does (it installs one when
// it finds SIGUSR1 at its default), and waits kDumpWindow for the dumps to be
// written before it sends the stop signal. A rank that does not catch
// SIGUSR1 (a program without ddp, a Python one) is not sent it: the default
// action would kill it at once, before its own SIGTERM handling. Whether a
// process catches a signal is read from the SigCgt mask of
// /proc/<pid>/status, so this is Linux-only; elsewhere nothing is asked.
//
// A stopped rank (SIGSTOP, SIGTSTP, a debugger that let go badly) would keep
// both signals pending until SIGKILL. It is sent SIGCONT after SIGUSR1, so
// that it writes its dump (its history is the one that says where it
// stopped) and later handles the stop signal.
//
// A dump is written by a thread of the rank; the rank's main thread goes on
// meanwhile, so a rank stopped just before a collective may record that
// collective as issued in the window. The analyzer reads the entry's times.

#include "launch/teardown_dumps.h"

#include "flight_recorder/dump_directory.h"

#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace ddp::launch {
namespace {

// The value of the field `name` ("SigCgt:", "State:") of /proc/<pid>/status,
// or an empty string when it cannot be read.
std::string status_field(pid_t pid, const std::string& name) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.compare(0, name.size(), name) == 0) {
      const auto begin = line.find_first_not_of(" \t", name.size());
      return begin == std::string::npos ? std::string() : line.substr(begin);
    }
  }
  return {};
}

bool catches(pid_t pid, int signal_number) {
  const std::string mask = status_field(pid, "SigCgt:");
  if (mask.empty()) {
    return false;
  }
  // Hexadecimal, the highest signal first; signal n is bit n - 1.
  const int bit = signal_number - 1;
  const auto digit_index = static_cast<int>(mask.size()) - 1 - bit / 4;
  if (digit_index < 0) {
    return false;
  }
  const char c = mask[static_cast<size_t>(digit_index)];
  const int digit = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
  return digit >= 0 && digit < 16 && ((digit >> (bit % 4)) & 1) != 0;
}

bool stopped(pid_t pid) {
  const std::string state = status_field(pid, "State:");
  return !state.empty() && (state[0] == 'T' || state[0] == 't');
}

} // namespace

bool ask_for_dump(pid_t pid) {
  if (!catches(pid, SIGUSR1)) {
    return false;
  }
  ::kill(pid, SIGUSR1);
  if (stopped(pid)) {
    ::kill(pid, SIGCONT);
  }
  return true;
}

bool is_stopped(pid_t pid) {
  return stopped(pid);
}

bool can_dump(pid_t pid) {
  return catches(pid, SIGUSR1);
}

std::string dump_directory() {
  return flight_recorder::dump_directory();
}

} // namespace ddp::launch
