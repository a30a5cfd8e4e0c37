#pragma once

// The progress line of one epoch: step, loss, samples/s, ETA.

#include <chrono>
#include <cstdint>
#include <string>

namespace mnist {

/// Shows the progress of one epoch on stdout. On a terminal it redraws a
/// single line (with '\r') at most ten times a second; otherwise (a pipe, a
/// file, ddprun) it prints a plain line at every fifth of the epoch but the
/// last, which the caller's summary of the epoch replaces, so that logs stay
/// short and readable.
///
/// Only rank 0 should show progress: every rank runs the same steps, and N
/// copies of the line would only be noise.
///
/// Thread-safety: use from one thread.
class Progress {
 public:
  /// `label` starts the line ("epoch 2/3"); `steps` is the number of steps
  /// in the epoch.
  Progress(std::string label, int64_t steps);

  /// Whether `update` after step `step` (1-based) would print. Ask first, so
  /// that the caller reads the loss off the device only when it is shown.
  bool due(int64_t step) const;

  /// Shows the state after step `step`: `samples` processed so far by all
  /// ranks together, and the mean loss so far.
  void update(int64_t step, int64_t samples, double loss);

  /// Ends the line on a terminal.
  void finish();

 private:
  const std::string label_;
  const int64_t steps_;
  const bool terminal_;
  const int64_t every_; // steps between plain lines
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

/// "1m05s", "42s": a duration for humans.
std::string format_duration(double seconds);

} // namespace mnist
