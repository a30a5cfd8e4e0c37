# The flight recorder: each process group's ring of its last collectives and
# the dumps it writes (the dump directory's naming is shared with ddprun,
# which compiles it too: src/launch/launch.cmake). It knows no other output;
# the process-group core hands it the timeline as a listener
# (src/comm/recorder_outputs.cpp). Its readers are ddprun's
# (src/launch/readers/).
ddp_add_part(ddp_flight_recorder
  src/flight_recorder/flight_recorder.cpp
  src/flight_recorder/dump_directory.cpp)
