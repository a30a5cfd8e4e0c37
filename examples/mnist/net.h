#pragma once

// The network of mnist_train: PyTorch's classic MNIST example network.

#include <torch/torch.h>

#include <ddp/nn/fully_sharded_data_parallel.h>

namespace mnist {

/// Two convolutions and two linear layers, 28x28 grayscale in, 10 logits
/// out. Unlike PyTorch's example it has no dropout: dropout draws random
/// numbers, and a run resumed from a checkpoint would draw different ones
/// from an uninterrupted run, so the two would no longer match exactly.
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(320, 50))),
        fc2(register_module("fc2", torch::nn::Linear(50, 10))) {}

  /// `x`: float [B, 1, 28, 28]; returns the logits, float [B, 10].
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1(x), 2)); // [B, 10, 12, 12]
    x = torch::relu(torch::max_pool2d(conv2(x), 2)); // [B, 20, 4, 4]
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(ConvNet);

/// The same network for --fsdp: each layer an ddp::FsdpUnit, so that
/// FullyShardedDataParallel gathers one layer's parameters at a time. The
/// same values from the same seed as ConvNet; the names gain ".module"
/// ("conv1.module.weight").
struct FsdpConvNetImpl : torch::nn::Module {
  FsdpConvNetImpl()
      : conv1(register_module("conv1", ddp::FsdpUnit(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5))))),
        conv2(register_module("conv2", ddp::FsdpUnit(torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5))))),
        fc1(register_module("fc1", ddp::FsdpUnit(torch::nn::Linear(320, 50)))),
        fc2(register_module("fc2", ddp::FsdpUnit(torch::nn::Linear(50, 10)))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1(x), 2));
    x = torch::relu(torch::max_pool2d(conv2(x), 2));
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  ddp::FsdpUnit conv1;
  ddp::FsdpUnit conv2;
  ddp::FsdpUnit fc1;
  ddp::FsdpUnit fc2;
};
TORCH_MODULE(FsdpConvNet);

} // namespace mnist
