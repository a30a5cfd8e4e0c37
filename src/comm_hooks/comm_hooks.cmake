# DistributedDataParallel's communication hooks (include/ddp/comm_hooks/):
# the default and compressing hooks, PowerSGD, post-local SGD.
ddp_add_part(ddp_comm_hooks
  src/comm_hooks/comm_hooks.cpp
  src/comm_hooks/powersgd_state.cpp
  src/comm_hooks/powersgd_hook.cpp
  src/comm_hooks/batched_powersgd_hook.cpp
  src/comm_hooks/post_local_sgd_hook.cpp)
target_precompile_headers(ddp_comm_hooks REUSE_FROM ddp_nn)
