#pragma once

// A decoder-only transformer (GPT) written with LibTorch modules, named as
// nanoGPT names its parameters ("transformer.h.0.attn.c_attn.weight"), so
// that gpt.py, its PyTorch twin, loads the same state dicts: token and
// position embeddings, n_layer blocks of LayerNorm, causal self-attention,
// LayerNorm and an MLP, a final LayerNorm and an output head (not tied to
// the token embedding: FSDP shards each parameter in one unit).
//
// Each block is a ddp::FsdpUnit (a pass-through without FSDP: under
// FullyShardedDataParallel each block is a unit, the embeddings, final
// LayerNorm and head the root unit), optionally around a ddp::Checkpointed
// (activation checkpointing), optionally deferred (built when FSDP shards
// it). Neither wrapper adds a level to the state dicts' names. The
// constructor leaves LibTorch's initial values; init_module is GPT-2's,
// applied by ddp::seeded_init.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace gpt {

struct Config {
  int64_t vocab_size = 256; // bytes
  int64_t block_size = 128; // the longest sequence
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool activation_checkpointing = false;
  /// Blocks built later, one at a time (ddp::deferred_unit): under
  /// FullyShardedDataParallel with param_init each rank keeps only its
  /// shards; ddp::materialize builds them whole.
  bool deferred = false;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};

 private:
  int64_t n_head_;
  torch::Tensor mask_; // causal, (block, block); not a buffer: nothing to save
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Config& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const Config& config);

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<ddp::FsdpUnit> blocks; // h's entries, to call
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const Config& config);
  /// Logits (batch, sequence, vocab) of `tokens` (batch, sequence), int64.
  torch::Tensor forward(const torch::Tensor& tokens);

  const Config& config() const { return config_; }

  Transformer transformer{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  Config config_;
};
TORCH_MODULE(GPT);

/// GPT-2's initialisation of one module, a ddp::ModuleInit (use it with
/// ddp::seeded_init or FullyShardedDataParallelOptions().param_init):
/// weights of Linear and Embedding layers N(0, 0.02), the residual
/// projections ("...c_proj") N(0, 0.02 / sqrt(2 n_layer)), biases 0,
/// LayerNorms 1 and 0.
ddp::ModuleInit init_module(int64_t n_layer);

/// How many parameter elements a GPT of `config` holds.
int64_t parameter_count(const Config& config);

/// The mean cross entropy of `logits` against `targets`.
torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets);

/// `count` bytes sampled after `prompt` (greedy when temperature is 0),
/// from a plain model in eval mode.
std::string sample(GPT& model, const std::string& prompt, int64_t count, double temperature, uint64_t seed);

} // namespace gpt
