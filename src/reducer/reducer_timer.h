#pragma once

// The moments of one iteration that DDP's insight figures are computed from
// (private header). One time per event, as PyTorch's reducer timer keeps
// them: the figures are differences between events, or between an event and
// a bucket's launch or completion.

#include <array>
#include <chrono>
#include <cstddef>
#include <optional>

namespace ddp::internal {

// Thread-safety: none; the Reducer guards it with its mutex.
class IterationTimer {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Event : size_t {
    kForwardStart,  // DDP's forward entered
    kForwardEnd,    // DDP's forward returned
    kBackwardStart, // the iteration's first gradient (or its shadow or delayed reduction)
    kBackwardEnd,   // the iteration's last gradient so far
    kCount,
  };

  void record(Event event, Clock::time_point when = Clock::now()) {
    times_[static_cast<size_t>(event)] = when;
    if (event == Event::kBackwardStart) {
      // A new backward: its last gradient is still to come.
      times_[static_cast<size_t>(Event::kBackwardEnd)].reset();
    }
  }

  // When `event` happened, if it did.
  const std::optional<Clock::time_point>& at(Event event) const {
    return times_[static_cast<size_t>(event)];
  }

  // Milliseconds from `from` to `when`; 0 when `from` was not recorded.
  double ms_since(Event from, Clock::time_point when = Clock::now()) const {
    const auto& start = times_[static_cast<size_t>(from)];
    return start ? std::chrono::duration<double, std::milli>(when - *start).count() : 0.0;
  }

  // Milliseconds from `from` to `to`; 0 when either was not recorded.
  double ms_between(Event from, Event to) const {
    const auto& end = times_[static_cast<size_t>(to)];
    return end ? ms_since(from, *end) : 0.0;
  }

 private:
  std::array<std::optional<Clock::time_point>, static_cast<size_t>(Event::kCount)> times_;
};

} // namespace ddp::internal
