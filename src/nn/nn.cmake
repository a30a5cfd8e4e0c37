# DistributedDataParallel, its Reducer and bucket assignment, Join,
# communication hooks (src/comm_hooks/) and checkpoints.
ddp_add_part(ddp_nn
  src/reducer/bucket_assignment.cpp
  src/reducer/reducer.cpp
  src/reducer/reducer_finalize.cpp
  src/reducer/reducer_insight.cpp
  src/reducer/sparse_gradients.cpp
  src/reducer/static_graph.cpp
  src/nn/state_sync.cpp
  src/nn/distributed_data_parallel.cpp
  src/comm_hooks/comm_hooks.cpp
  src/comm_hooks/powersgd_state.cpp
  src/comm_hooks/powersgd_hook.cpp
  src/comm_hooks/batched_powersgd_hook.cpp
  src/comm_hooks/post_local_sgd_hook.cpp
  src/nn/join.cpp
  src/nn/checkpoint_files.cpp
  src/nn/checkpoint.cpp
  src/nn/sync_batch_norm.cpp
  src/nn/activation_checkpoint.cpp)
target_precompile_headers(ddp_nn PRIVATE <torch/torch.h>)
