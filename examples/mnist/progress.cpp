#include "progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace mnist {

namespace {

constexpr int kBarWidth = 20;
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

} // namespace

Progress::Progress(std::string label, int64_t steps)
    : label_(std::move(label)),
      steps_(steps),
      terminal_(::isatty(STDOUT_FILENO) == 1),
      every_(steps >= 5 ? (steps + 4) / 5 : 1),
      start_(std::chrono::steady_clock::now()) {}

bool Progress::due(int64_t step) const {
  if (terminal_) {
    return step == steps_ || !drawn_ ||
           std::chrono::steady_clock::now() - last_draw_ >= kRedrawInterval;
  }
  // The epoch's summary line follows the last step: no plain line for it.
  return step % every_ == 0 && step < steps_;
}

void Progress::update(int64_t step, int64_t samples, double loss) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? samples / elapsed : 0.0;
  const double eta = step > 0 ? elapsed / step * (steps_ - step) : 0.0;
  const std::string time = step == steps_ ? "took " + format_duration(elapsed)
                                          : "ETA " + format_duration(eta);
  if (terminal_) {
    const int filled = steps_ > 0 ? static_cast<int>(kBarWidth * step / steps_) : kBarWidth;
    const std::string bar = std::string(filled, '#') + std::string(kBarWidth - filled, '.');
    // "\033[K" clears what is left of a longer previous line.
    std::printf("\r%s [%s] %lld/%lld  loss %.4f  %.0f samples/s  %s\033[K", label_.c_str(),
                bar.c_str(), static_cast<long long>(step), static_cast<long long>(steps_), loss,
                rate, time.c_str());
    std::fflush(stdout);
  } else {
    std::printf("%s  step %lld/%lld  loss %.4f  %.0f samples/s  %s\n", label_.c_str(),
                static_cast<long long>(step), static_cast<long long>(steps_), loss, rate,
                time.c_str());
  }
  drawn_ = true;
  last_draw_ = now;
}

void Progress::finish() {
  if (terminal_ && drawn_) {
    std::printf("\n");
    std::fflush(stdout);
  }
  drawn_ = false;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) {
    return "?";
  }
  char text[32];
  if (seconds < 10) {
    std::snprintf(text, sizeof text, "%.1fs", seconds);
  } else if (seconds < 60) {
    std::snprintf(text, sizeof text, "%.0fs", seconds);
  } else {
    const auto total = static_cast<long long>(std::lround(seconds));
    if (total < 3600) {
      std::snprintf(text, sizeof text, "%lldm%02llds", total / 60, total % 60);
    } else {
      std::snprintf(text, sizeof text, "%lldh%02lldm", total / 3600, total % 3600 / 60);
    }
  }
  return text;
}

} // namespace mnist
