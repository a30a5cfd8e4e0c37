#pragma once

// Starting the ranks and watching over them until they have all exited.

#include <string>

#include "launch/options.h"

namespace ddp::launch {

/// Starts `options.nproc_per_node` ranks of `options.program`, relays their
/// output, and stops them all when one fails or when ddprun is asked to stop
/// (SIGINT, SIGTERM, SIGHUP or SIGQUIT). Returns ddprun's exit code: 0 when
/// every rank exited 0; else the first failed rank's exit code, or 128 + the
/// signal that killed it, or 128 + the signal ddprun received. When a rank
/// fails and `options.max_restarts` allows, the group is stopped and started
/// again instead, with a new rendezvous and TORCHELASTIC_RESTART_COUNT and
/// DDP_RESTART_COUNT set to the number of restarts so far; the exit code is
/// then that of the last attempt.
///
/// When `options.master_port` is unset, a free port is picked for every
/// attempt (pick_free_port; it throws std::runtime_error when none can be
/// found). Installs its own handlers for those signals and SIGCHLD, and
/// ignores SIGPIPE, until it returns; on Linux it also makes the process a
/// child subreaper. Call it once, from the only thread of the process: it
/// forks, and reaps every child with waitpid(-1).
int run_ranks(const LaunchOptions& options);

/// "SIGKILL" for 9, and so on for the common signals; "SIG<n>" otherwise.
std::string signal_name(int signal_number);

} // namespace ddp::launch
