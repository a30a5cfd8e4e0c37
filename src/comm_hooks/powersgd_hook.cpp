// PowerSGD, how it works.
//
// A bucket holds the flat gradients of some parameters. Each gradient is seen
// as a matrix M of n x m (its first dimension by the product of the rest).
// Sending a rank-r approximation P Q^T (P: n x r, Q: m x r) costs (n + m) r
// elements instead of n m, so a gradient is compressed only when that saves
// at least `min_compression_rate` times; the rest (biases, small matrices)
// are summed uncompressed in one flat tensor and divided by the world size.
//
// One step of power iteration per training iteration finds P and Q:
//   1. M += error (what the last compression lost on this rank), and keep a
//      copy of M to compute the next error;
//   2. Q is the previous iteration's Q (warm start), or random numbers drawn
//      the same on every rank; orthogonalize it;
//   3. P = M Q; allreduce P, which then is (sum of the ranks' M) Q;
//   4. orthogonalize P (Gram-Schmidt, columns of unit norm);
//   5. Q = M^T P; allreduce Q and divide it by the world size, so that it is
//      (mean M)^T P;
//   6. M = P Q^T, the same on every rank, and error = the copy - M.
// Both allreduces are linear in M, so W ranks compute what one process would
// on the mean of their M: that is what tests/nn/powersgd_main.cpp checks.
//
// Note [PowerSGD collective order]
// Steps 4-5 need step 3's result, so the Q allreduce of a bucket can only be
// issued once its P allreduce has completed. Issuing it from the completion
// callback (on the process group's thread) would race with the autograd
// thread issuing the next bucket's P, and ranks could issue collectives in
// different orders, which the ProcessGroup contract forbids. So every
// collective is issued on the autograd thread, in an order fixed by bucket
// index: the hook call for bucket i issues P(i) (with the uncompressed
// tensors in the same allreduce), then waits for P(i-1) (usually complete by
// then: it ran while bucket i's gradients were computed) and issues Q(i-1);
// the last bucket's call also waits for its own P and issues its Q. Per
// iteration: P0 P1 Q0 P2 Q1 ... Pn Qn-1 Qn, on every rank. Step 6 runs on the
// process group's thread when Q's allreduce completes, and completes the
// bucket's Work.

#include "comm_hooks/powersgd_internal.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "internal/check.h"

namespace ddp::comm_hooks {

using internal::ChainedWork;
using internal::orthogonalize;

std::shared_ptr<Work> PowerSGDState::run_hook(ProcessGroup& group, GradBucket& bucket) {
  if (auto plain = plain_unless_compressing(group, bucket)) {
    return plain;
  }
  const size_t index = bucket.index();
  auto& memory = memory_for(bucket, /*batched=*/false);
  auto current = std::make_unique<InFlight>();
  current->index = index;
  current->memory = memory;
  current->buffer = bucket.buffer();
  at::Tensor& buffer = current->buffer;

  // Step 1: error feedback.
  if (options_.use_error_feedback()) {
    if (memory->error.defined() && memory->error.numel() == buffer.numel()) {
      buffer.add_(memory->error);
    } else {
      memory->error = at::zeros_like(buffer);
    }
    current->input_copy = buffer.clone();
  }

  // Which gradients to compress, grouped by matrix shape in order of first
  // appearance (PyTorch's order, which its random draws follow).
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::vector<at::Tensor>>> by_shape;
  int64_t numel_before = 0;
  int64_t numel_after = 0;
  for (const at::Tensor& gradient : bucket.gradients()) {
    if (gradient.dim() == 0) {
      current->uncompressed.push_back(gradient);
      current->uncompressed_numel += 1;
      numel_before += 1;
      numel_after += 1;
      continue;
    }
    const int64_t n = gradient.size(0);
    const int64_t m = n == 0 ? 0 : gradient.numel() / n;
    const int64_t r = std::min({n, m, options_.matrix_approximation_rank()});
    numel_before += n * m;
    if (static_cast<double>((n + m) * r) * options_.min_compression_rate() <
        static_cast<double>(n * m)) {
      numel_after += (n + m) * r;
      const auto shape = std::make_pair(n, m);
      auto it = std::find_if(by_shape.begin(), by_shape.end(),
                             [&](const auto& entry) { return entry.first == shape; });
      if (it == by_shape.end()) {
        by_shape.push_back({shape, {}});
        it = by_shape.end() - 1;
      }
      it->second.push_back(gradient.view({n, m}));
    } else {
      numel_after += n * m;
      current->uncompressed.push_back(gradient);
      current->uncompressed_numel += gradient.numel();
    }
  }
  numel_before_ += numel_before;
  numel_after_ += numel_after;

  // The matrices, one by one or stacked by shape (PyTorch's
  // batch_tensors_with_same_shape), and the room their P and Q take.
  int64_t p_numel = 0;
  int64_t q_numel = 0;
  for (auto& [shape, matrices] : by_shape) {
    const int64_t r = std::min({shape.first, shape.second, options_.matrix_approximation_rank()});
    if (options_.batch_tensors_with_same_shape() && matrices.size() > 1) {
      current->matrices.push_back(at::stack(matrices));
      current->originals.push_back(matrices);
    } else {
      for (const auto& matrix : matrices) {
        current->matrices.push_back(matrix.unsqueeze(0));
        current->originals.emplace_back();
      }
    }
    const auto count = static_cast<int64_t>(matrices.size());
    p_numel += count * shape.first * r;
    q_numel += count * shape.second * r;
  }

  // Step 2: Q.
  const bool randomize = !options_.warm_start() || !memory->q.defined() ||
                         memory->q.numel() != q_numel;
  if (randomize) {
    memory->q = at::empty({q_numel}, buffer.options());
  }
  current->first = at::empty({current->uncompressed_numel + p_numel}, buffer.options());
  {
    int64_t p_offset = current->uncompressed_numel;
    int64_t q_offset = 0;
    for (const auto& matrices : current->matrices) {
      const int64_t b = matrices.size(0);
      const int64_t n = matrices.size(1);
      const int64_t m = matrices.size(2);
      const int64_t r = std::min({n, m, options_.matrix_approximation_rank()});
      current->ps.push_back(current->first.narrow(0, p_offset, b * n * r).view({b, n, r}));
      current->qs.push_back(memory->q.narrow(0, q_offset, b * m * r).view({b, m, r}));
      p_offset += b * n * r;
      q_offset += b * m * r;
    }
  }
  if (randomize && q_numel > 0) {
    // One draw per Q (per stack when batched), as PyTorch's: a draw of b x m
    // x r numbers is not b draws of m x r.
    auto generator = at::detail::createCPUGenerator(next_seed());
    for (auto& q : current->qs) {
      q.copy_(at::randn(q.sizes(), generator, buffer.options().device(at::kCPU)));
    }
  }
  for (auto& q : current->qs) {
    orthogonalize(q, options_.orthogonalization_epsilon());
  }

  // Step 3: P = M Q, sent with the uncompressed tensors.
  {
    int64_t offset = 0;
    for (const auto& tensor : current->uncompressed) {
      current->first.narrow(0, offset, tensor.numel()).copy_(tensor.reshape({-1}));
      offset += tensor.numel();
    }
  }
  for (size_t k = 0; k < current->matrices.size(); ++k) {
    at::bmm_out(current->ps[k], current->matrices[k], current->qs[k]);
  }
  return launch(group, std::move(current), "powerSGD", bucket.is_last());
}

void PowerSGDState::finish(ProcessGroup& group, InFlight& bucket) {
  if (!first_completed(bucket)) {
    return;
  }
  const auto result = bucket.result;
  const int64_t world_size = group.size();
  // The allreduce wrote `first` in place.
  if (bucket.uncompressed_numel > 0) {
    at::Tensor sums = bucket.first.narrow(0, 0, bucket.uncompressed_numel).div_(world_size);
    int64_t offset = 0;
    for (auto& tensor : bucket.uncompressed) {
      tensor.copy_(sums.narrow(0, offset, tensor.numel()).view_as(tensor));
      offset += tensor.numel();
    }
  }
  auto decompress = [result, world_size, memory = bucket.memory, buffer = bucket.buffer,
                     input_copy = bucket.input_copy, matrices = bucket.matrices,
                     originals = bucket.originals, ps = bucket.ps, qs = bucket.qs,
                     warm_start = options_.warm_start()](const std::vector<at::Tensor>&) {
    // Step 6. Runs on the process group's thread (or here, in a world of
    // size 1).
    if (memory->q.defined()) {
      memory->q.div_(world_size);
    }
    for (size_t k = 0; k < matrices.size(); ++k) {
      at::Tensor m = matrices[k];
      at::bmm_out(m, ps[k], qs[k].transpose(1, 2));
      for (size_t i = 0; i < originals[k].size(); ++i) {
        originals[k][i].copy_(m[static_cast<int64_t>(i)]);
      }
    }
    if (input_copy.defined()) {
      at::sub_out(memory->error, input_copy, buffer);
    }
    if (!warm_start) {
      memory->q = at::Tensor();
    }
    result->set_result({buffer});
    return std::vector<at::Tensor>{buffer};
  };
  if (bucket.matrices.empty()) {
    // Nothing compressed: no Q to send (the same on every rank).
    try {
      decompress({});
    } catch (...) {
      if (!result->is_completed()) {
        result->set_error(std::current_exception());
      }
    }
    return;
  }
  // Steps 4 and 5.
  for (auto& p : bucket.ps) {
    orthogonalize(p, options_.orthogonalization_epsilon());
  }
  for (size_t k = 0; k < bucket.matrices.size(); ++k) {
    at::bmm_out(bucket.qs[k], bucket.matrices[k].transpose(1, 2), bucket.ps[k]);
  }
  const at::Tensor& q = bucket.memory->q;
  bytes_allreduced_ += static_cast<uint64_t>(q.nbytes());
  ++allreduce_calls_;
  internal::send_q(group, result, q, std::move(decompress));
}

CommHook powerSGD(std::shared_ptr<PowerSGDState> state) {
  DDP_CHECK(state != nullptr, "comm_hooks::powerSGD: the state is null");
  return with_state(state, [state](ProcessGroup& group, GradBucket& bucket) {
    return state->run_hook(group, bucket);
  });
}

} // namespace ddp::comm_hooks
