# Work, ProcessGroup, the argument checks the backends share, the Gloo backend
# and rendezvous.
ddp_add_part(ddp_comm
  src/comm/types.cpp
  src/comm/work.cpp
  src/comm/process_group.cpp
  src/comm/collective_checks.cpp
  src/comm/process_group_gloo.cpp
  src/comm/reduce_kernels.cpp
  src/comm/gloo_rendezvous.cpp
  src/comm/init.cpp)
target_precompile_headers(ddp_comm PRIVATE <ATen/ATen.h>)
