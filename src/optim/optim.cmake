# Sharded optimizer state: ZeroRedundancyOptimizer and the partition rule;
# PostLocalSGDOptimizer (an optimizer with a model averager).
ddp_add_part(ddp_optim
  src/optim/partition.cpp
  src/optim/zero_impl.cpp
  src/optim/zero_redundancy_optimizer.cpp
  src/optim/zero_overlap.cpp
  src/optim/post_local_sgd_optimizer.cpp)
target_precompile_headers(ddp_optim REUSE_FROM ddp_nn)
