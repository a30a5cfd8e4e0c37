#pragma once

// `ddprun --analyze DIR`: reads the flight recorder dumps of every rank
// (rank_<R>.json, Note [Flight recorder] in flight_recorder.cpp) and prints,
// per process group, the verdict first, e.g.
//   group default, allreduce #57: rank 1 never called it (its last was
//   allreduce #56); rank 0 waits in it since 12.4 s
// then the collectives whose ranks disagree (operation, dtype, size), and
// the ranks that wrote no dump. Plain C++17, no Torch: it runs in ddprun.

#include <cstdio>
#include <string>

namespace ddp::flight_recorder {

// Returns 0 when it read at least one dump and printed its verdicts, 1 when
// DIR holds no readable dump (it says why on `err`).
int analyze_directory(const std::string& dir, std::FILE* out, std::FILE* err);

} // namespace ddp::flight_recorder
