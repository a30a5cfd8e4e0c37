"""PyTorch's FullyShardedDataParallel with bfloat16 mixed precision on the
CPU (Gloo): the reference of fsdp_mixed_precision_main (tests/fsdp).

Usage (under ddprun, like torchrun):
  build/ddprun --nproc-per-node 2 python tests/fsdp/pytorch_fsdp_reference.py OUT STRATEGY
STRATEGY is full or grad-op. The model, data and training are
fsdp_mixed_precision_main's: the Sequential of six Linear units of
tests/fsdp/fsdp_models.h with closed-form weights (the formulas of
tests/nn/pytorch_ddp_reference.py), each Linear a unit (ModuleWrapPolicy),
parameters and gradient reduction in bfloat16, SGD lr 0.05 momentum 0.9,
10 steps of each rank's slice of the closed-form batches. Rank 0 writes the
full state to OUT ("name v0 v1 ...", %.9g) and exits 0.
"""

import functools
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nn"))
import pytorch_ddp_reference as ref  # noqa: E402  (the closed-form formulas)

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy, StateDictType  # noqa: E402
from torch.distributed.fsdp import FullStateDictConfig  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402

STEPS = 10


def six_unit_mlp():
    h = ref.K_HIDDEN
    net = nn.Sequential(nn.Linear(ref.K_IN, h), nn.Tanh(), nn.Linear(h, h), nn.ReLU(),
                        nn.Linear(h, h), nn.Tanh(), nn.Linear(h, h), nn.ReLU(),
                        nn.Linear(h, h), nn.Tanh(), nn.Linear(h, ref.K_OUT))
    ref.init_closed_form(net)
    return net


def main():
    out, strategy = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = FSDP(six_unit_mlp(),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 sharding_strategy=(ShardingStrategy.FULL_SHARD if strategy == "full"
                                    else ShardingStrategy.SHARD_GRAD_OP),
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.bfloat16),
                 device_id=torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    per_rank = ref.K_GLOBAL_BATCH // world
    for step in range(STEPS):
        x, y = ref.samples(step * ref.K_GLOBAL_BATCH + rank * per_rank, per_rank)
        optimizer.zero_grad()
        ((model(x).float() - y) ** 2).mean().backward()
        optimizer.step()
    config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    if rank == 0:
        with open(out, "w") as f:
            for name, value in state.items():
                flat = value.detach().double().reshape(-1).tolist()
                f.write(name + "".join(" %.9g" % v for v in flat) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
