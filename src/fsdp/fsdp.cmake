# FullyShardedDataParallel: flat units, the iteration's hooks, full states.
ddp_add_part(ddp_fsdp
  src/fsdp/buffer_pool.cpp
  src/fsdp/flat_unit.cpp
  src/fsdp/fully_sharded_data_parallel.cpp
  src/fsdp/state_dict.cpp
  src/fsdp/optim_state.cpp
  src/fsdp/sharded_checkpoint.cpp
  src/fsdp/auto_wrap.cpp
  src/fsdp/construction_checks.cpp
  src/fsdp/deferred_init.cpp)
target_precompile_headers(ddp_fsdp REUSE_FROM ddp_nn)
