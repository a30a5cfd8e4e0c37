// The GPT model of gpt.h.

#include "gpt.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#include <cmath>

namespace gpt {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const Config& config)
    : c_attn(register_module("c_attn", torch::nn::Linear(config.n_embd, 3 * config.n_embd))),
      c_proj(register_module("c_proj", torch::nn::Linear(config.n_embd, config.n_embd))),
      attn_dropout(register_module("attn_dropout", torch::nn::Dropout(config.dropout))),
      resid_dropout(register_module("resid_dropout", torch::nn::Dropout(config.dropout))), n_head_(config.n_head) {
  TORCH_CHECK(config.n_embd % config.n_head == 0, "gpt: n_embd ", config.n_embd, " is not a multiple of n_head ",
              config.n_head);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hs = c / n_head_;
  auto qkv = c_attn(x).split(c, /*dim=*/2);
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head_, hs}).transpose(1, 2); };
  const auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hs)));
  const auto causal = torch::ones({t, t}, x.options().dtype(torch::kBool)).tril();
  att = att.masked_fill(causal.logical_not(), -std::numeric_limits<double>::infinity());
  att = attn_dropout(torch::softmax(att, -1));
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
  return resid_dropout(c_proj(y));
}

MlpImpl::MlpImpl(const Config& config)
    : c_fc(register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd))),
      c_proj(register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd))),
      dropout(register_module("dropout", torch::nn::Dropout(config.dropout))) {}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return dropout(c_proj(torch::gelu(c_fc(x))));
}

BlockImpl::BlockImpl(const Config& config)
    : ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})))),
      ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})))),
      attn(register_module("attn", CausalSelfAttention(config))), mlp(register_module("mlp", Mlp(config))) {}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

TransformerImpl::TransformerImpl(const Config& config)
    : wte(register_module("wte", torch::nn::Embedding(config.vocab_size, config.n_embd))),
      wpe(register_module("wpe", torch::nn::Embedding(config.block_size, config.n_embd))),
      drop(register_module("drop", torch::nn::Dropout(config.dropout))),
      h(register_module("h", torch::nn::ModuleList())),
      ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})))) {
  for (int64_t i = 0; i < config.n_layer; ++i) {
    ddp::FsdpUnit unit{nullptr};
    if (config.deferred && config.activation_checkpointing) {
      unit = ddp::deferred_unit([config] { return ddp::Checkpointed(Block(config)); });
    } else if (config.deferred) {
      unit = ddp::deferred_unit([config] { return Block(config); });
    } else if (config.activation_checkpointing) {
      unit = ddp::FsdpUnit(ddp::Checkpointed(Block(config)));
    } else {
      unit = ddp::FsdpUnit(Block(config));
    }
    h->push_back(unit);
    blocks.push_back(unit);
  }
}

GPTImpl::GPTImpl(const Config& config)
    : transformer(register_module("transformer", Transformer(config))),
      lm_head(register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.n_embd, config.vocab_size)
                                                               .bias(false)))),
      config_(config) {}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TORCH_CHECK(t <= config_.block_size, "gpt: a sequence of ", t, " tokens; the model's block size is ",
              config_.block_size);
  const auto positions = torch::arange(t, tokens.options());
  auto x = transformer->drop(transformer->wte(tokens) + transformer->wpe(positions));
  for (auto& block : transformer->blocks) {
    x = block(x);
  }
  return lm_head(transformer->ln_f(x));
}

ddp::ModuleInit init_module(int64_t n_layer) {
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  return [residual_std](torch::nn::Module& module, const std::string& path) {
    if (auto* linear = module.as<torch::nn::Linear>()) {
      const bool residual = path.size() >= 6 && path.compare(path.size() - 6, 6, "c_proj") == 0;
      linear->weight.normal_(0.0, residual ? residual_std : 0.02);
      if (linear->bias.defined()) {
        linear->bias.zero_();
      }
    } else if (auto* embedding = module.as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, 0.02);
    } else {
      ddp::reset_parameters(module, path); // LayerNorm: ones and zeros
    }
  };
}

int64_t parameter_count(const Config& config) {
  const int64_t c = config.n_embd;
  // A block: c_attn 3c*c + 3c, c_proj c*c + c, c_fc 4c*c + 4c, mlp c_proj
  // 4c*c + c, two LayerNorms 4c.
  const int64_t block = 12 * c * c + 13 * c;
  return config.n_layer * block + (config.vocab_size + config.block_size) * c + 2 * c + c * config.vocab_size;
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

std::string sample(GPT& model, const std::string& prompt, int64_t count, double temperature, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const auto device = model->parameters().front().device();
  auto generator = at::detail::createCPUGenerator(seed);
  std::vector<int64_t> tokens;
  for (const unsigned char c : prompt) {
    tokens.push_back(c);
  }
  if (tokens.empty()) {
    tokens.push_back('\n');
  }
  std::string out;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - model->config().block_size);
    auto context = torch::tensor(std::vector<int64_t>(tokens.begin() + start, tokens.end()), torch::kLong)
                       .view({1, -1})
                       .to(device);
    auto logits = model->forward(context).select(1, -1).squeeze(0).to(torch::kCPU, torch::kFloat);
    int64_t next;
    if (temperature <= 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      auto probabilities = torch::softmax(logits / temperature, -1);
      next = torch::multinomial(probabilities, 1, /*replacement=*/false, generator).item<int64_t>();
    }
    tokens.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  model->train(was_training);
  return out;
}

} // namespace gpt
