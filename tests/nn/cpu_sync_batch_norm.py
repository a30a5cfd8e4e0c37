"""PyTorch's SyncBatchNorm on the CPU, for pytorch_ddp_reference.py's
sync_batch_norm configurations.

PyTorch's SyncBatchNorm runs on CUDA only: its autograd function
(torch.nn.modules._functions.SyncBatchNorm) calls five kernels that have no
CPU implementation (torch.batch_norm_stats and the four below), its
module's forward refuses CPU input (1.13), and DDP refuses an
nn.SyncBatchNorm layer on the CPU. The reference for these configurations
is therefore PyTorch's own autograd function, under PyTorch's DDP over
gloo (its all_gather of every rank's [mean, invstd, count], its masking of
empty ranks, its all_reduce of [sum_dy, sum_dy_xmu] in backward), with the
five kernels computed here on the CPU from their definitions, and called by
CpuSyncBatchNorm: a BatchNorm (same state, same names) whose forward does
what nn.SyncBatchNorm.forward does.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _per_channel(t, input):
    return t.view([1, -1] + [1] * (input.dim() - 2))


def _channel_dims(input):
    return [0] + list(range(2, input.dim()))


def cpu_batch_norm_stats(input, eps):
    """torch.batch_norm_stats: per channel, the mean and 1 / sqrt(biased variance + eps)."""
    mean = input.mean(_channel_dims(input))
    var = (input - _per_channel(mean, input)).square().mean(_channel_dims(input))
    return mean, torch.rsqrt(var + eps)


def cpu_batch_norm_gather_stats_with_counts(input, mean_all, invstd_all, running_mean,
                                            running_var, momentum, eps, counts):
    """torch.batch_norm_gather_stats_with_counts: the group's mean and invstd from
    each rank's (rows) and counts; moves the running statistics towards them (the
    variance unbiased over the group's count)."""
    counts = counts.to(mean_all.dtype).view(-1, 1)
    total = counts.sum()
    mean = (counts * mean_all).sum(0) / total
    var_all = invstd_all.reciprocal().square() - eps
    var = (counts * (var_all + (mean_all - mean).square())).sum(0) / total
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(momentum * mean)
    if running_var is not None:
        running_var.mul_(1 - momentum).add_(momentum * var * total / (total - 1))
    return mean, torch.rsqrt(var + eps)


def cpu_batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    """torch.batch_norm_elemt: (x - mean) * invstd * weight + bias."""
    out = (input - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        out = out * _per_channel(weight, input)
    if bias is not None:
        out = out + _per_channel(bias, input)
    return out


def cpu_batch_norm_backward_reduce(grad_output, input, mean, invstd, weight, input_g,
                                   weight_g, bias_g):
    """torch.batch_norm_backward_reduce: this rank's sum_dy and sum_dy_xmu per channel,
    and the parameters' gradients from them."""
    xmu = input - _per_channel(mean, input)
    sum_dy = grad_output.sum(_channel_dims(input))
    sum_dy_xmu = (grad_output * xmu).sum(_channel_dims(input))
    grad_weight = sum_dy_xmu * invstd if weight_g else None
    grad_bias = sum_dy if bias_g else None
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def cpu_batch_norm_backward_elemt(grad_output, input, mean, invstd, weight, sum_dy,
                                  sum_dy_xmu, count):
    """torch.batch_norm_backward_elemt: the input's gradient from the group's sums
    and total count."""
    total = count.sum()
    xmu = input - _per_channel(mean, input)
    scale = invstd if weight is None else invstd * weight
    return ((grad_output - _per_channel(sum_dy / total, input)
             - xmu * _per_channel(invstd.square() * sum_dy_xmu / total, input))
            * _per_channel(scale, input))


def use_cpu_sync_batch_norm_kernels():
    torch.batch_norm_stats = cpu_batch_norm_stats
    torch.batch_norm_gather_stats_with_counts = cpu_batch_norm_gather_stats_with_counts
    torch.batch_norm_elemt = cpu_batch_norm_elemt
    torch.batch_norm_backward_reduce = cpu_batch_norm_backward_reduce
    torch.batch_norm_backward_elemt = cpu_batch_norm_backward_elemt
    if not torch.cuda.is_available():
        # PyTorch 1.13's function asks whether a CUDA graph is being captured,
        # which a build without CUDA cannot answer; on the CPU none is.
        torch.cuda.is_current_stream_capturing = lambda: False


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm whose training forward, in a world of more than one rank, is
    PyTorch's SyncBatchNorm autograd function over the default group."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        from torch.nn.modules._functions import SyncBatchNorm as sync_batch_norm
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        world_size = dist.get_world_size()
        if not self.training or world_size == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, self.training or not self.track_running_stats,
                                factor, self.eps)
        tracked = self.track_running_stats
        return sync_batch_norm.apply(input, self.weight, self.bias,
                                     self.running_mean if tracked else None,
                                     self.running_var if tracked else None,
                                     self.eps, factor, dist.group.WORLD, world_size)


def with_cpu_sync_batch_norm(net):
    """Replaces every BatchNorm1d and BatchNorm2d under `net` by a CpuSyncBatchNorm
    with the same state (as nn.SyncBatchNorm.convert_sync_batchnorm would)."""
    use_cpu_sync_batch_norm_kernels()
    for name, child in net.named_children():
        if isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)):
            sync = CpuSyncBatchNorm(child.num_features, child.eps, child.momentum,
                                    child.affine, child.track_running_stats)
            sync.load_state_dict(child.state_dict())
            setattr(net, name, sync)
        else:
            with_cpu_sync_batch_norm(child)
    return net
