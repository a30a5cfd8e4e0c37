#pragma once

// Models, initial weights and data in closed form, for the parity tests of
// DistributedDataParallel (tests/nn/*_main.cpp).
//
// Every value is computed element by element with std::sin / std::cos in
// double and rounded to float once, so that every rank, the single-process
// reference and PyTorch (tests/nn/pytorch_ddp_reference.py, which repeats
// these formulas with math.sin / math.cos) build bit-identical weights and
// batches without exchanging files. Torch only: the plain checkpoint loader
// (checkpoint_plain_load_main.cpp) includes this without linking ddp.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace ddp_test {

constexpr int64_t kIn = 8;
constexpr int64_t kHidden = 16;
constexpr int64_t kOut = 4;
// Divisible by 1, 2 and 3: every world size of the suite gets equal slices.
constexpr int64_t kGlobalBatch = 12;

/// A tensor of `sizes` whose element with flat index n is fn(n), computed in
/// double and rounded to float.
template <typename Fn>
torch::Tensor closed_form_tensor(at::IntArrayRef sizes, Fn fn) {
  auto values = torch::empty(sizes, torch::kDouble);
  auto* data = values.data_ptr<double>();
  for (int64_t n = 0; n < values.numel(); ++n) {
    data[n] = fn(n);
  }
  return values.to(torch::kFloat);
}

/// Sets parameter k (in `parameters()` order), element n (flat), to
/// 0.1 * sin(7n + 3k + 1). Buffers are left alone.
inline void init_closed_form(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  int64_t k = 0;
  for (auto& p : module.parameters()) {
    p.copy_(closed_form_tensor(p.sizes(), [k](int64_t n) {
      return 0.1 * std::sin(7.0 * static_cast<double>(n) + 3.0 * static_cast<double>(k) + 1.0);
    }));
    ++k;
  }
}

/// Samples [first, first + count) of the endless closed-form data set:
/// x[g][f] = sin(0.9g + 0.37f + 0.2), y[g][o] = cos(0.5g + 1.3o).
inline std::pair<torch::Tensor, torch::Tensor> samples(int64_t first, int64_t count) {
  auto x = closed_form_tensor({count, kIn}, [first](int64_t n) {
    const double g = static_cast<double>(first + n / kIn);
    const double f = static_cast<double>(n % kIn);
    return std::sin(0.9 * g + 0.37 * f + 0.2);
  });
  auto y = closed_form_tensor({count, kOut}, [first](int64_t n) {
    const double g = static_cast<double>(first + n / kOut);
    const double o = static_cast<double>(n % kOut);
    return std::cos(0.5 * g + 1.3 * o);
  });
  return {x, y};
}

/// The global batch of training step `step`: kGlobalBatch samples.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  return samples(step * kGlobalBatch, kGlobalBatch);
}

/// Rank `rank`'s slice of `step`'s global batch in a world of `world_size`:
/// rows [rank * B / W, (rank + 1) * B / W).
inline std::pair<torch::Tensor, torch::Tensor> rank_batch(int64_t step, int rank, int world_size) {
  const int64_t per_rank = kGlobalBatch / world_size;
  return samples(step * kGlobalBatch + rank * per_rank, per_rank);
}

/// The MLP of the parity tests: four Linear layers. The Python reference
/// builds the same nn.Sequential, so names ("0.weight", ...) and parameter
/// order match.
inline torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::ReLU(),
                               torch::nn::Linear(kHidden, kHidden), torch::nn::Tanh(),
                               torch::nn::Linear(kHidden, kHidden), torch::nn::ReLU(),
                               torch::nn::Linear(kHidden, kOut));
}

/// The MLP with a BatchNorm1d after its first layer: it has buffers
/// (running statistics), for the buffer broadcasts and checkpoints.
inline torch::nn::Sequential make_bn_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::BatchNorm1d(kHidden),
                               torch::nn::ReLU(), torch::nn::Linear(kHidden, kHidden),
                               torch::nn::Tanh(), torch::nn::Linear(kHidden, kOut));
}

/// Four used Linear layers and one, `extra`, that forward never calls: its
/// parameters get no gradient in any iteration (find_unused_parameters).
/// `extra` is registered between used layers, so that it shares buckets
/// with them.
struct BranchNetImpl : torch::nn::Module {
  BranchNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kHidden))),
        extra(register_module("extra", torch::nn::Linear(kHidden, kHidden))),
        fc3(register_module("fc3", torch::nn::Linear(kHidden, kHidden))),
        fc4(register_module("fc4", torch::nn::Linear(kHidden, kOut))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(fc2(torch::relu(fc1(x))));
    // The branch not taken: `extra` would go here.
    return fc4(torch::relu(fc3(x)));
  }

  torch::nn::Linear fc1, fc2, extra, fc3, fc4;
};
TORCH_MODULE(BranchNet);

/// Rows of the embedding tables, and tokens per sample, of the sparse models.
constexpr int64_t kVocab = 24;
constexpr int64_t kTokens = 3;

/// Tokens of samples [first, first + count): token j of sample g is
/// (7g + 5j + j*j) mod kVocab, so that the ranks' slices share some rows and
/// each step leaves some rows untouched.
inline torch::Tensor token_samples(int64_t first, int64_t count) {
  auto tokens = torch::empty({count, kTokens}, torch::kLong);
  auto* data = tokens.data_ptr<int64_t>();
  for (int64_t n = 0; n < count * kTokens; ++n) {
    const int64_t g = first + n / kTokens;
    const int64_t j = n % kTokens;
    data[n] = (7 * g + 5 * j + j * j) % kVocab;
  }
  return tokens;
}

/// The tokens of rank `rank`'s slice of step `step` (as rank_batch), or of
/// the whole global batch with world_size 1.
inline torch::Tensor rank_tokens(int64_t step, int rank, int world_size) {
  const int64_t per_rank = kGlobalBatch / world_size;
  return token_samples(step * kGlobalBatch + rank * per_rank, per_rank);
}

/// An Embedding with sparse gradients (sparse(true)) and a Linear head:
/// the mean of a sample's token embeddings, through tanh, to kOut outputs.
/// `tied` also reads the embedding's first kOut rows densely (an output
/// projection sharing the table), which makes its gradient dense.
struct EmbeddingNetImpl : torch::nn::Module {
  explicit EmbeddingNetImpl(bool tied = false)
      : emb(register_module(
            "emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(kVocab, kIn).sparse(true)))),
        fc(register_module("fc", torch::nn::Linear(kIn, kOut))),
        tied_(tied) {}

  torch::Tensor forward(torch::Tensor tokens) {
    auto h = torch::tanh(emb(tokens).mean(1));
    auto out = fc(h);
    if (tied_) {
      out = out + 0.5 * h.matmul(emb->weight.narrow(0, 0, kOut).t());
    }
    return out;
  }

  torch::nn::Embedding emb;
  torch::nn::Linear fc;

 private:
  bool tied_;
};
TORCH_MODULE(EmbeddingNet);

/// The EmbeddingBag twin of EmbeddingNet: a sparse bag summing each sample's
/// token embeddings, through tanh, to a Linear head.
struct EmbeddingBagNetImpl : torch::nn::Module {
  EmbeddingBagNetImpl()
      : bag(register_module("bag", torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(kVocab, kIn)
                                                               .sparse(true)
                                                               .mode(torch::kSum)))),
        fc(register_module("fc", torch::nn::Linear(kIn, kOut))) {}

  torch::Tensor forward(torch::Tensor tokens) {
    return fc(torch::tanh(bag(tokens)));
  }

  torch::nn::EmbeddingBag bag;
  torch::nn::Linear fc;
};
TORCH_MODULE(EmbeddingBagNet);

/// The MLP with closed-form weights.
inline torch::nn::Sequential make_closed_form_mlp() {
  auto net = make_mlp();
  init_closed_form(*net);
  return net;
}

/// Writes "name v0 v1 ..." per parameter and buffer, values as %.9g (which
/// reads back as the same float); a complex value as its two parts.
inline bool write_state_text(const torch::nn::Module& module, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return false;
  }
  auto write = [&](const std::string& name, const torch::Tensor& tensor) {
    // A complex tensor as its real and imaginary parts, side by side.
    auto values = tensor.is_complex() ? torch::view_as_real(tensor.detach()) : tensor.detach();
    auto flat = values.reshape({-1}).to(torch::kDouble).contiguous();
    std::fprintf(file, "%s", name.c_str());
    for (int64_t i = 0; i < flat.numel(); ++i) {
      std::fprintf(file, " %.9g", flat.data_ptr<double>()[i]);
    }
    std::fprintf(file, "\n");
  };
  for (const auto& item : module.named_parameters()) {
    write(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    write(item.key(), item.value());
  }
  return std::fclose(file) == 0;
}

} // namespace ddp_test
