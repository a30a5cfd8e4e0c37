#pragma once

// A process group's flight recorder with the timeline as its listener
// (private header). The recorder (src/flight_recorder/) and the timeline
// (src/timeline/) know nothing of each other; this is where the process
// group layer, which uses both, joins them.

#include <memory>
#include <string>

#include "flight_recorder/flight_recorder.h"

namespace ddp::internal {

// The recorder of a new group (FlightRecorder::create). When the timeline
// is on (Note [Timeline] in timeline.cpp), each collective that ends is
// drawn on its track "collectives: <group> (<backend>)", the first group's
// rank names the timeline's file, and a dump request (SIGUSR1) writes the
// timeline too. nullptr when the recorder is off. Throws c10::Error naming
// the rank and the group's creation for a bad DDP_FLIGHT_RECORDER_SIZE or
// timeline setting.
std::shared_ptr<FlightRecorder> make_flight_recorder(std::string group, std::string backend, int rank, int size);

} // namespace ddp::internal
