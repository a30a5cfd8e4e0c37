// gpt_train's periodic checkpoints (--checkpoint-dir DIR --checkpoint-every N):
// after every N steps the ranks save a DCP directory DIR/step-S, then rank 0
// names it in DIR/latest (written to a temporary file and renamed, so that
// `latest` is always whole) and removes the older ones. `latest` is the
// commit point: a save killed half-way leaves a step-S that nothing names,
// and the next attempt resumes from the one `latest` names. The format of
// `latest`, two lines a person can read and scripts/chaos.py parses:
//
//   checkpoint step-40
//   completed_steps 40
//
// These helpers touch files only (no LibTorch), and only rank 0 calls them.
#pragma once

#include <cstdint>
#include <string>

namespace gpt {

// "step-S": the directory name of the checkpoint taken after S steps.
std::string snapshot_name(int64_t completed_steps);

// The steps done by the checkpoint DIR/latest names, or -1 when DIR has no
// `latest`. Throws std::runtime_error naming the file when it is malformed
// or names a directory that is not there.
int64_t read_latest(const std::string& dir);

// Names DIR/step-S in DIR/latest (a temporary file renamed over it).
void write_latest(const std::string& dir, int64_t completed_steps);

// Removes every DIR/step-* but DIR/step-S (`keep`): the older checkpoints,
// and what a save killed half-way left. Returns how many it removed.
int remove_other_snapshots(const std::string& dir, int64_t keep);

// Creates DIR (and its parents) if missing; throws naming it when it can't.
void make_directory(const std::string& dir);

} // namespace gpt
