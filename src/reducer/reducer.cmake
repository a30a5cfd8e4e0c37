# The Reducer: DistributedDataParallel's buckets, autograd hooks and
# reductions (Note [Reducer] and the Notes it points to), and its one
# extension point for what consumes reduced buckets (set_bucket_consumer).
ddp_add_part(ddp_reducer
  src/reducer/bucket_assignment.cpp
  src/reducer/reducer.cpp
  src/reducer/reducer_finalize.cpp
  src/reducer/reducer_insight.cpp
  src/reducer/sparse_gradients.cpp
  src/reducer/static_graph.cpp)
target_precompile_headers(ddp_reducer REUSE_FROM ddp_nn)
