#pragma once

// The model, data and optimizers that the checkpoint interoperability tests
// train on both sides, C++ here and Python in interop_model.py, from the
// same closed-form values: Sequential(Linear(8, 16), BatchNorm1d(16),
// ReLU, Linear(16, 4)) in eval mode (its BatchNorm a fixed affine map with
// buffers worth carrying, the same on any number of ranks), every value
// of step s a function of s alone. A global batch of 12 rows: rank r of W
// takes rows [12r/W, 12(r+1)/W).

#include <torch/torch.h>

#include <memory>
#include <string>

namespace ddp_test::interop {

constexpr int64_t kBatch = 12;

inline at::Tensor wave(int64_t n, double scale, double phase) {
  return torch::arange(n, torch::kFloat64).add(1 + phase).mul(scale).sin().to(torch::kFloat);
}

inline torch::nn::Sequential make_model() {
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                            torch::nn::Linear(16, 4));
  torch::NoGradGuard no_grad;
  int64_t t = 0;
  for (const auto& item : net->named_parameters()) {
    item.value().copy_(wave(item.value().numel(), 0.7, 1000.0 * static_cast<double>(t++)).mul(0.3).view_as(item.value()));
  }
  auto& bn = *net[1]->as<torch::nn::BatchNorm1d>();
  bn.running_mean.copy_(wave(16, 0.3, 5.0).mul(0.2));
  bn.running_var.copy_(wave(16, 0.5, 9.0).abs().add(0.5));
  bn.num_batches_tracked.fill_(7);
  net->eval();
  return net;
}

inline std::pair<at::Tensor, at::Tensor> batch(int64_t step, int rank, int world) {
  auto x = wave(kBatch * 8, 0.37, 1000.0 * static_cast<double>(step)).view({kBatch, 8});
  auto y = wave(kBatch * 4, 0.11, 1000.0 * static_cast<double>(step) + 500).view({kBatch, 4});
  const int64_t from = kBatch * rank / world;
  const int64_t to = kBatch * (rank + 1) / world;
  return {x.slice(0, from, to), y.slice(0, from, to)};
}

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                                std::vector<at::Tensor> params) {
  using namespace torch::optim;
  if (name == "adam") {
    return std::make_unique<Adam>(params, AdamOptions(0.01).weight_decay(0.001));
  }
  if (name == "adamw") {
    return std::make_unique<AdamW>(params, AdamWOptions(0.01).weight_decay(0.05).amsgrad(true));
  }
  if (name == "sgd") {
    return std::make_unique<SGD>(params, SGDOptions(0.05).momentum(0.9).nesterov(true));
  }
  if (name == "rmsprop") {
    return std::make_unique<RMSprop>(params, RMSpropOptions(0.01).momentum(0.5).centered(true));
  }
  if (name == "adagrad") {
    return std::make_unique<Adagrad>(params, AdagradOptions(0.05).lr_decay(0.01));
  }
  throw std::runtime_error("unknown optimizer '" + name + "'");
}

} // namespace ddp_test::interop
