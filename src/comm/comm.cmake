# The process-group core: Work, ProcessGroup, the composite group, the
# argument checks, reduce kernels and send/recv Work the backends share, the
# buffers in shared memory that Gloo and MPI reduce in (src/comm/shm/), and
# init_process_group. Each backend is a part of its own in its folder. The
# flight recorder (its own folder, src/flight_recorder/) is compiled into
# this part: every backend and Work::wait record into it, so a test that
# links the core links it too. So is the timeline (src/timeline/), which the
# recorder and Work::wait feed. Its analyzer and JSON reader are ddprun's
# (src/launch/launch.cmake).
ddp_add_part(ddp_comm
  src/comm/types.cpp
  src/comm/work.cpp
  src/comm/process_group.cpp
  src/comm/process_group_composite.cpp
  src/comm/monitored_barrier.cpp
  src/comm/fingerprint.cpp
  src/comm/failure_ledger.cpp
  src/comm/collective_label.cpp
  src/comm/alltoall_splits.cpp
  src/comm/batch_p2p.cpp
  src/comm/objects/object_collectives.cpp
  src/comm/objects/object_frame.cpp
  src/comm/collective_checks.cpp
  src/comm/point_to_point_work.cpp
  src/comm/contiguous_arguments.cpp
  src/comm/reduce_kernels.cpp
  src/comm/shm/shared_buffers.cpp
  src/comm/init.cpp
  src/comm/rendezvous_arrival.cpp
  src/comm/slurm_env.cpp
  src/comm/subgroups.cpp
  src/flight_recorder/flight_recorder.cpp
  src/flight_recorder/dump_directory.cpp
  src/timeline/timeline.cpp)

# The backends' parts reuse this precompiled <ATen/ATen.h> (set in their
# files): compiling one costs ~22 s of CPU, and the README's first command
# waits for each.
target_precompile_headers(ddp_comm PRIVATE <ATen/ATen.h>)

include(src/comm/gloo/gloo.cmake)
include(src/comm/nccl/nccl.cmake)
include(src/comm/mpi/mpi.cmake)
