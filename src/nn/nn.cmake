# DistributedDataParallel, Join, SyncBatchNorm, activation checkpointing
# and checkpoints. Its Reducer (src/reducer/) and communication hooks
# (src/comm_hooks/) are parts of their own, which use this part's
# precompiled header.
ddp_add_part(ddp_nn
  src/nn/state_sync.cpp
  src/nn/distributed_data_parallel.cpp
  src/nn/join.cpp
  src/nn/checkpoint_files.cpp
  src/nn/checkpoint.cpp
  src/nn/sync_batch_norm.cpp
  src/nn/batch_norm_in_place.cpp
  src/nn/activation_checkpoint.cpp)
target_precompile_headers(ddp_nn PRIVATE <torch/torch.h>)
