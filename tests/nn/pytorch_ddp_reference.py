"""PyTorch's side of the parity test: ddp_pytorch_parity_main's models, data
and training, under torch.nn.parallel.DistributedDataParallel.

Usage (run by pytorch_parity_driver.py, under ddprun like torchrun):
  build/ddprun --nproc-per-node 2 /usr/bin/python3 tests/nn/pytorch_ddp_reference.py OUT_PREFIX
On rank 0, writes OUT_PREFIX.<configuration>.txt with the final parameters,
and OUT_PREFIX.<configuration>.initial.txt with the initial ones.

The formulas repeat tests/nn/closed_form.h exactly (math.sin and math.cos
in double, rounded to float32 once), so that both sides start bit-identical.
"""

import math
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

K_IN = 8
K_HIDDEN = 16
K_OUT = 4
K_GLOBAL_BATCH = 12
K_STEPS = 5


def closed_form_tensor(sizes, fn):
    count = math.prod(sizes)
    values = torch.tensor([fn(n) for n in range(count)], dtype=torch.float64)
    return values.reshape(sizes).to(torch.float32)


def init_closed_form(module):
    with torch.no_grad():
        for k, p in enumerate(module.parameters()):
            p.copy_(closed_form_tensor(
                tuple(p.shape), lambda n: 0.1 * math.sin(7.0 * n + 3.0 * k + 1.0)))


def samples(first, count):
    x = closed_form_tensor(
        (count, K_IN),
        lambda n: math.sin(0.9 * (first + n // K_IN) + 0.37 * (n % K_IN) + 0.2))
    y = closed_form_tensor(
        (count, K_OUT),
        lambda n: math.cos(0.5 * (first + n // K_OUT) + 1.3 * (n % K_OUT)))
    return x, y


def rank_batch(step, rank, world_size):
    per_rank = K_GLOBAL_BATCH // world_size
    return samples(step * K_GLOBAL_BATCH + rank * per_rank, per_rank)


def make_mlp():
    return nn.Sequential(nn.Linear(K_IN, K_HIDDEN), nn.ReLU(),
                         nn.Linear(K_HIDDEN, K_HIDDEN), nn.Tanh(),
                         nn.Linear(K_HIDDEN, K_HIDDEN), nn.ReLU(),
                         nn.Linear(K_HIDDEN, K_OUT))


class BranchNet(nn.Module):
    """closed_form.h's BranchNet: `extra` is never used by forward."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(K_IN, K_HIDDEN)
        self.fc2 = nn.Linear(K_HIDDEN, K_HIDDEN)
        self.extra = nn.Linear(K_HIDDEN, K_HIDDEN)
        self.fc3 = nn.Linear(K_HIDDEN, K_HIDDEN)
        self.fc4 = nn.Linear(K_HIDDEN, K_OUT)

    def forward(self, x):
        x = torch.tanh(self.fc2(torch.relu(self.fc1(x))))
        return self.fc4(torch.relu(self.fc3(x)))


def write_state_text(module, path):
    with open(path, "w") as out:
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            values = tensor.detach().reshape(-1).to(torch.float64).tolist()
            out.write(name + "".join(" %.9g" % v for v in values) + "\n")


def train_and_write(net, ddp_kwargs, path):
    rank = dist.get_rank()
    init_closed_form(net)
    if rank == 0:
        write_state_text(net, path.replace(".txt", ".initial.txt"))
    model = nn.parallel.DistributedDataParallel(net, **ddp_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    for step in range(K_STEPS):
        x, y = rank_batch(step, rank, dist.get_world_size())
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        write_state_text(net, path)
        print("wrote " + path, flush=True)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: pytorch_ddp_reference.py OUT_PREFIX")
    prefix = sys.argv[1]
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    train_and_write(make_mlp(), {}, prefix + ".mlp.txt")
    train_and_write(BranchNet(),
                    {"find_unused_parameters": True, "gradient_as_bucket_view": True},
                    prefix + ".branch.txt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
