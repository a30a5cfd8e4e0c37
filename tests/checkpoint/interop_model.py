"""The model, data and optimizers of interop_model.h, in Python: the same
closed-form values, so that C++ and Python train the same model on the same
batches from the same start."""
import torch
import torch.nn as nn

BATCH = 12


def wave(n, scale, phase):
    return torch.arange(n, dtype=torch.float64).add(1 + phase).mul(scale).sin().float()


def make_model():
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        for t, (_, p) in enumerate(net.named_parameters()):
            p.copy_(wave(p.numel(), 0.7, 1000.0 * t).mul(0.3).view_as(p))
        bn = net[1]
        bn.running_mean.copy_(wave(16, 0.3, 5.0).mul(0.2))
        bn.running_var.copy_(wave(16, 0.5, 9.0).abs().add(0.5))
        bn.num_batches_tracked.fill_(7)
    net.eval()
    return net


def batch(step, rank=0, world=1):
    x = wave(BATCH * 8, 0.37, 1000.0 * step).view(BATCH, 8)
    y = wave(BATCH * 4, 0.11, 1000.0 * step + 500).view(BATCH, 4)
    lo, hi = BATCH * rank // world, BATCH * (rank + 1) // world
    return x[lo:hi], y[lo:hi]


def make_optimizer(name, params):
    o = torch.optim
    if name == "adam":
        return o.Adam(params, lr=0.01, weight_decay=0.001)
    if name == "adamw":
        return o.AdamW(params, lr=0.01, weight_decay=0.05, amsgrad=True)
    if name == "sgd":
        return o.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    if name == "rmsprop":
        return o.RMSprop(params, lr=0.01, momentum=0.5, centered=True)
    if name == "adagrad":
        return o.Adagrad(params, lr=0.05, lr_decay=0.01)
    raise ValueError("unknown optimizer " + name)
