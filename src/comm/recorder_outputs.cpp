// A process group's flight recorder with the timeline as its listener
// (recorder_outputs.h).

#include "comm/recorder_outputs.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "internal/check.h"
#include "timeline/timeline.h"

namespace ddp::internal {

namespace {

// Draws each collective that ends on one track of the timeline.
class TimelineListener final : public CollectiveListener {
 public:
  TimelineListener(std::shared_ptr<Timeline> timeline, const std::string& track_name)
      : timeline_(std::move(timeline)), track_(timeline_->track(track_name)) {}

  void ended(const FlightRecorder::Entry& entry) override {
    // A collective that failed before it started spans its time in the
    // queue.
    const int64_t start = entry.started_us != 0 ? entry.started_us : entry.queued_us;
    timeline_->complete(track_, entry.label.empty() ? entry.op : entry.op + " (" + entry.label + ")", start,
                        entry.completed_us,
                        TimelineArgs()
                            .add("seq", static_cast<int64_t>(entry.seq))
                            .add("shape", entry.shape)
                            .add("label", entry.label)
                            .add("queued_us", start - entry.queued_us)
                            .add("state", std::string(to_string(entry.state)))
                            .take());
  }

 private:
  const std::shared_ptr<Timeline> timeline_;
  const int track_;
};

} // namespace

std::shared_ptr<FlightRecorder> make_flight_recorder(std::string group, std::string backend, int rank, int size) {
  std::shared_ptr<Timeline> timeline;
  try {
    if (Timeline* first = Timeline::get()) { // Note [Timeline]: the first group names the file
      first->set_rank(rank, size);
    }
    timeline = Timeline::shared();
  } catch (const c10::Error& e) {
    DDP_CHECK(false, "[rank ", rank, "/", size, "] creating a ", backend, " process group: ",
              e.what_without_backtrace());
  }
  std::shared_ptr<CollectiveListener> listener;
  if (timeline) {
    listener = std::make_shared<TimelineListener>(timeline, c10::str("collectives: ", group, " (", backend, ")"));
    // Held weakly: the timeline's destruction at exit writes it.
    on_dump_request([weak = std::weak_ptr<Timeline>(timeline)] {
      if (const auto live = weak.lock()) {
        live->write();
      }
    });
  }
  return FlightRecorder::create(std::move(group), std::move(backend), rank, size, std::move(listener));
}

} // namespace ddp::internal
