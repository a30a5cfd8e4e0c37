# The process-group core: Work, ProcessGroup, the composite group, the fake
# group (src/comm/fake/: one process playing one rank of any world), the
# argument checks, reduce kernels and send/recv Work the backends share, the
# buffers in shared memory that Gloo and MPI reduce in (src/comm/shm/), and
# init_process_group. Each backend is a part of its own in its folder. The
# core uses the flight recorder (src/flight_recorder/) and the timeline
# (src/timeline/), parts of their own, and joins them
# (recorder_outputs.cpp): a test that links the core links those two too.
ddp_add_part(ddp_comm
  src/comm/types.cpp
  src/comm/work.cpp
  src/comm/process_group.cpp
  src/comm/process_group_composite.cpp
  src/comm/monitored_barrier.cpp
  src/comm/fingerprint.cpp
  src/comm/failure_ledger.cpp
  src/comm/collective_label.cpp
  src/comm/recorder_outputs.cpp
  src/comm/alltoall_splits.cpp
  src/comm/batch_p2p.cpp
  src/comm/objects/object_collectives.cpp
  src/comm/objects/object_frame.cpp
  src/comm/objects/same_on_every_rank.cpp
  src/comm/collective_checks.cpp
  src/comm/point_to_point_work.cpp
  src/comm/contiguous_arguments.cpp
  src/comm/complex_arguments.cpp
  src/comm/reduce_kernels.cpp
  src/comm/shm/shared_buffers.cpp
  src/comm/shm/cross_memory.cpp
  src/comm/reduce_targets.cpp
  src/comm/init.cpp
  src/comm/rendezvous_arrival.cpp
  src/comm/slurm_env.cpp
  src/comm/subgroups.cpp
  src/comm/fake/process_group_fake.cpp
  src/comm/fake/fake_link.cpp
  src/comm/fake/fake_shared_buffers.cpp)

# The backends' parts reuse this precompiled <ATen/ATen.h> (set in their
# files): compiling one costs ~22 s of CPU, and the README's first command
# waits for each.
target_precompile_headers(ddp_comm PRIVATE <ATen/ATen.h>)
# Note [Gradients read where they lie]: a product and a sum must not fuse
# into one FMA (the bits must be the TCP path's), so this file is compiled on
# its own with contraction off.
set_source_files_properties(src/comm/shm/cross_memory.cpp PROPERTIES
  COMPILE_OPTIONS -ffp-contract=off SKIP_UNITY_BUILD_INCLUSION ON)

include(src/comm/gloo/gloo.cmake)
include(src/comm/nccl/nccl.cmake)
include(src/comm/mpi/mpi.cmake)
