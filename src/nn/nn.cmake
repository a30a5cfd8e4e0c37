# DistributedDataParallel and its Reducer.
ddp_add_part(ddp_nn src/nn/nn_placeholder.cpp)
