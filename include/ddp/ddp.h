#pragma once

/// Umbrella header: everything a training program needs from ddp.

#include <ddp/blas.h>
#include <ddp/comm/batch_p2p.h>
#include <ddp/comm/error.h>
#include <ddp/comm/flight_recorder.h>
#include <ddp/comm/object_collectives.h>
#include <ddp/store/file_store.h>
#include <ddp/store/hash_store.h>
#include <ddp/store/prefix_store.h>
#include <ddp/comm/process_group.h>
#include <ddp/comm/process_group_composite.h>
#include <ddp/comm/process_group_gloo.h>
#include <ddp/comm/process_group_mpi.h>
#include <ddp/store/store.h>
#include <ddp/store/tcp_store.h>
#include <ddp/store/torch_tcp_store.h>
#include <ddp/comm/types.h>
#include <ddp/comm/work.h>
#include <ddp/data/distributed_sampler.h>
#include <ddp/group.h>
#include <ddp/init.h>
#include <ddp/nn/checkpoint.h>
#include <ddp/nn/comm_hooks.h>
#include <ddp/nn/distributed_data_parallel.h>
#include <ddp/nn/fully_sharded_data_parallel.h>
#include <ddp/nn/insight.h>
#include <ddp/nn/join.h>
#include <ddp/nn/post_local_sgd_hook.h>
#include <ddp/nn/powersgd_hook.h>
#include <ddp/nn/sharded_checkpoint.h>
#include <ddp/nn/sync_batch_norm.h>
#include <ddp/optim/post_local_sgd_optimizer.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/algorithms/model_averaging.h>
#include <ddp/timeline.h>
