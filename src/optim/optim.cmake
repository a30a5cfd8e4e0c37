# Sharded optimizer state: ZeroRedundancyOptimizer and the partition rule.
ddp_add_part(ddp_optim
  src/optim/partition.cpp
  src/optim/zero_redundancy_optimizer.cpp
  src/optim/zero_overlap.cpp)
target_precompile_headers(ddp_optim REUSE_FROM ddp_nn)
