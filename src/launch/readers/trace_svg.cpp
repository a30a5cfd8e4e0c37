// trace.svg: the merged timeline's last steps as one picture, for a user
// without a trace viewer. One row per rank and track, time across: a span
// is a bar (its name, duration and step in a tooltip), a moment a tick.
// Overlap shows as bars stacked in time on a rank's rows, a straggler as a
// rank whose bars start late, idle time as empty rows.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "launch/readers/trace_merge.h"

namespace ddp::timeline {

namespace {

constexpr double kLabelWidth = 260;
constexpr double kPlotWidth = 1100;
constexpr double kRowHeight = 16;
constexpr double kRowGap = 4;
constexpr double kRankGap = 10;
constexpr double kTop = 56;
constexpr double kLegendHeight = 40;

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
  }
  return out;
}

std::string fixed(double value, int digits = 1) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

struct Kind {
  const char* label;
  const char* color;
};

constexpr Kind kForward{"forward", "#4e79a7"};
constexpr Kind kBackward{"backward", "#f28e2b"};
constexpr Kind kWait{"waits", "#e15759"};
constexpr Kind kBucket{"buckets", "#59a14f"};
constexpr Kind kCollective{"collectives", "#76b7b2"};
constexpr Kind kOptimizer{"optimizer", "#edc948"};
constexpr Kind kOther{"other", "#bab0ac"};

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

Kind kind_of(const std::string& track, const std::string& name) {
  if (name == "forward") {
    return kForward;
  }
  if (name == "backward") {
    return kBackward;
  }
  if (starts_with(name, "wait") || starts_with(track, "waits")) {
    return kWait;
  }
  if (starts_with(track, "buckets")) {
    return kBucket;
  }
  if (starts_with(track, "collectives")) {
    return kCollective;
  }
  if (starts_with(track, "optimizer")) {
    return kOptimizer;
  }
  return kOther;
}

// A round tick spacing, in ms, giving about 10 ticks over `span_ms`.
double tick_ms(double span_ms) {
  const double raw = std::max(span_ms / 10, 1e-3);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double factor : {1.0, 2.0, 5.0}) {
    if (factor * power >= raw) {
      return factor * power;
    }
  }
  return 10 * power;
}

} // namespace

std::string trace_svg(const MergedTrace& trace, int steps) {
  const int64_t last = trace.last_step;
  const int64_t first = last > 0 ? std::max<int64_t>(std::max<int64_t>(trace.first_step, 1), last - steps + 1) : 0;
  const auto shown = [&](const Span& span) { return last == 0 || (span.step >= first && span.step <= last); };
  double t0 = std::numeric_limits<double>::max();
  double t1 = std::numeric_limits<double>::lowest();
  for (const Span& span : trace.spans) {
    if (shown(span)) {
      t0 = std::min(t0, span.ts_us);
      t1 = std::max(t1, span.ts_us + span.dur_us);
    }
  }
  if (t0 > t1) {
    t0 = 0;
    t1 = 1;
  }
  const double span_us = std::max(t1 - t0, 1.0);
  const auto x_of = [&](double us) { return kLabelWidth + (us - t0) / span_us * kPlotWidth; };

  // Rows, with a little more room between ranks.
  std::vector<double> row_y;
  double y = kTop;
  for (size_t r = 0; r < trace.rows.size(); ++r) {
    if (r > 0 && trace.rows[r].rank != trace.rows[r - 1].rank) {
      y += kRankGap;
    }
    row_y.push_back(y);
    y += kRowHeight + kRowGap;
  }
  const double plot_bottom = y;
  const double width = kLabelWidth + kPlotWidth + 20;
  const double height = plot_bottom + kLegendHeight;

  std::string out;
  out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fixed(width, 0) + "\" height=\"" + fixed(height, 0) +
         "\" viewBox=\"0 0 " + fixed(width, 0) + " " + fixed(height, 0) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const std::string steps_text = last == 0 ? std::string("before the first step")
                                           : "step" + std::string(first == last ? " " : "s ") + std::to_string(first) +
          (first == last ? "" : "-" + std::to_string(last));
  out += "<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">ddp timeline: " +
         std::to_string(trace.ranks.size()) + " rank(s), " + steps_text + ", " + fixed(span_us / 1000, 2) +
         " ms</text>\n";

  // The time axis and its grid.
  const double tick = tick_ms(span_us / 1000);
  out += "<g class=\"axis\" stroke=\"#dddddd\">\n";
  for (double ms = 0; ms * 1000 <= span_us + 1e-9; ms += tick) {
    const double x = x_of(t0 + ms * 1000);
    out += "<line x1=\"" + fixed(x) + "\" y1=\"" + fixed(kTop - 8) + "\" x2=\"" + fixed(x) + "\" y2=\"" +
           fixed(plot_bottom) + "\"/>\n";
    out += "<text x=\"" + fixed(x) + "\" y=\"" + fixed(kTop - 12) +
           "\" stroke=\"none\" fill=\"#555555\" text-anchor=\"middle\">" + fixed(ms, tick < 1 ? 2 : 0) +
           " ms</text>\n";
  }
  out += "</g>\n";

  // Where each step began on the first rank: its forward.
  for (const Span& span : trace.spans) {
    if (shown(span) && span.name == "forward" && !trace.ranks.empty() && span.rank == trace.ranks.front()) {
      const double x = x_of(span.ts_us);
      out += "<line class=\"step\" x1=\"" + fixed(x) + "\" y1=\"" + fixed(kTop - 30) + "\" x2=\"" + fixed(x) +
             "\" y2=\"" + fixed(plot_bottom) + "\" stroke=\"#999999\" stroke-dasharray=\"4 3\"/>\n";
      out += "<text x=\"" + fixed(x + 3) + "\" y=\"" + fixed(kTop - 24) + "\" fill=\"#333333\">step " +
             std::to_string(span.step) + "</text>\n";
    }
  }

  for (size_t r = 0; r < trace.rows.size(); ++r) {
    const Row& row = trace.rows[r];
    const double top = row_y[r];
    out += "<g class=\"row\" data-rank=\"" + std::to_string(row.rank) + "\" data-track=\"" + escape(row.track) +
           "\">\n";
    out += "<rect x=\"" + fixed(kLabelWidth) + "\" y=\"" + fixed(top) + "\" width=\"" + fixed(kPlotWidth) +
           "\" height=\"" + fixed(kRowHeight) + "\" fill=\"#f4f4f4\"/>\n";
    out += "<text x=\"8\" y=\"" + fixed(top + kRowHeight - 4) + "\">rank " + std::to_string(row.rank) + "  " +
           escape(row.track) + "</text>\n";
    for (const Span& span : trace.spans) {
      if (span.rank != row.rank || span.tid != row.tid || !shown(span)) {
        continue;
      }
      const Kind kind = kind_of(row.track, span.name);
      const std::string tooltip = "<title>" + escape(span.name) + ": " + fixed(span.dur_us / 1000, 3) +
                                  " ms (step " + std::to_string(span.step) + ")</title>";
      const double x = x_of(span.ts_us);
      if (span.instant) {
        out += "<path d=\"M " + fixed(x) + " " + fixed(top) + " l 3 5 l -6 0 z\" fill=\"#333333\">" + tooltip +
               "</path>\n";
      } else {
        const double w = std::max(span.dur_us / span_us * kPlotWidth, 0.5);
        out += "<rect x=\"" + fixed(x, 2) + "\" y=\"" + fixed(top + 1) + "\" width=\"" + fixed(w, 2) +
               "\" height=\"" + fixed(kRowHeight - 2) + "\" fill=\"" + kind.color + "\">" + tooltip + "</rect>\n";
      }
    }
    out += "</g>\n";
  }

  // The legend.
  double x = kLabelWidth;
  const double legend_y = plot_bottom + 16;
  for (const Kind& kind : {kForward, kBackward, kBucket, kCollective, kWait, kOptimizer, kOther}) {
    out += "<rect x=\"" + fixed(x) + "\" y=\"" + fixed(legend_y - 10) + "\" width=\"12\" height=\"12\" fill=\"" +
           kind.color + "\"/>\n";
    out += "<text x=\"" + fixed(x + 16) + "\" y=\"" + fixed(legend_y) + "\">" + kind.label + "</text>\n";
    x += 110;
  }
  out += "</svg>\n";
  return out;
}

} // namespace ddp::timeline
