// batched_powerSGD: PowerSGD on a whole bucket at once, PyTorch's
// batched_powerSGD_hook. The bucket's n elements, padded with zeros to
// side * side (side = ceil(sqrt(n))), are one square matrix M; with Q of
// side x r (r = min(matrix_approximation_rank, side)):
//   1. M += error (padded length: the padding's share of the error is kept,
//      as PyTorch keeps it); keep a copy of M for the next error;
//   2. Q: the previous iteration's (warm start) or drawn as PyTorch draws
//      it; orthogonalize it (every iteration, as PyTorch does);
//   3. P = M Q; allreduce P; orthogonalize P;
//   4. Q = M^T P; allreduce Q; Q /= world size;
//   5. M = P Q^T; error = the copy - M; the bucket = M's first n elements.
// The two allreduces follow Note [PowerSGD collective order]
// (powersgd_hook.cpp), as the layer-wise hook's do.
//
// PyTorch 1.13 to 2.11 cannot run its own batched hook: its _orthogonalize
// takes only batches of matrices (3-D) since the layer-wise hook was
// batched, and the batched hook hands it a 2-D Q, which fails an assertion
// at the first compressed iteration. The parity test runs PyTorch's hook
// with that one call fixed (a 2-D matrix orthogonalized as a batch of one):
// see tests/nn/pytorch_ddp_reference.py, batched_powersgd.

#include "comm_hooks/powersgd_internal.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "internal/check.h"

namespace ddp::comm_hooks {

namespace {

// The smallest side with side * side >= n.
int64_t square_side(int64_t n) {
  auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  while (side * side < n) {
    ++side;
  }
  while (side > 0 && (side - 1) * (side - 1) >= n) {
    --side;
  }
  return side;
}

} // namespace

std::shared_ptr<Work> PowerSGDState::run_batched_hook(ProcessGroup& group, GradBucket& bucket) {
  if (auto plain = plain_unless_compressing(group, bucket)) {
    return plain;
  }
  const size_t index = bucket.index();
  auto& memory = memory_for(bucket, /*batched=*/true);
  auto current = std::make_unique<InFlight>();
  current->index = index;
  current->batched = true;
  current->memory = memory;
  current->buffer = bucket.buffer();
  const at::Tensor& buffer = current->buffer;
  const int64_t total = buffer.numel();
  const int64_t side = square_side(total);
  const int64_t r = std::min(options_.matrix_approximation_rank(), side);
  numel_before_ += total;
  numel_after_ += 2 * side * r;

  // Step 1.
  current->square = at::zeros({side * side}, buffer.options());
  current->square.narrow(0, 0, total).copy_(buffer.reshape({-1}));
  if (options_.use_error_feedback()) {
    if (memory->error.defined() && memory->error.numel() == side * side) {
      current->square.add_(memory->error);
    } else {
      memory->error = at::zeros_like(current->square);
    }
    current->input_copy = current->square.clone();
  }
  const at::Tensor matrix = current->square.view({side, side});

  // Step 2.
  if (!options_.warm_start() || !memory->q.defined() || memory->q.size(0) != side ||
      memory->q.size(1) != r) {
    auto generator = at::detail::createCPUGenerator(next_seed());
    memory->q = at::randn({side, r}, generator, buffer.options().device(at::kCPU)).to(buffer.device());
  }
  internal::orthogonalize(memory->q.unsqueeze(0), options_.orthogonalization_epsilon());

  // Step 3, first half.
  current->first = at::empty({side, r}, buffer.options());
  at::mm_out(current->first, matrix, memory->q);
  return launch(group, std::move(current), "batched_powerSGD", bucket.is_last());
}

void PowerSGDState::finish_batched(ProcessGroup& group, InFlight& bucket) {
  if (!first_completed(bucket)) {
    return;
  }
  const auto result = bucket.result;
  const int64_t world_size = group.size();
  at::Tensor p = bucket.first;
  at::Tensor q = bucket.memory->q;
  const int64_t side = p.size(0);
  const at::Tensor matrix = bucket.square.view({side, side});
  internal::orthogonalize(p.unsqueeze(0), options_.orthogonalization_epsilon());
  at::mm_out(q, matrix.t(), p);
  bytes_allreduced_ += static_cast<uint64_t>(q.nbytes());
  ++allreduce_calls_;
  auto decompress = [result, world_size, memory = bucket.memory, buffer = bucket.buffer,
                     square = bucket.square, input_copy = bucket.input_copy, p,
                     warm_start = options_.warm_start()](const std::vector<at::Tensor>&) {
    const int64_t side = p.size(0);
    memory->q.div_(world_size);
    at::Tensor matrix = square.view({side, side});
    at::mm_out(matrix, p, memory->q.t());
    if (input_copy.defined()) {
      at::sub_out(memory->error, input_copy, square);
    }
    buffer.copy_(square.narrow(0, 0, buffer.numel()).view_as(buffer));
    if (!warm_start) {
      memory->q = at::Tensor();
    }
    result->set_result({buffer});
    return std::vector<at::Tensor>{buffer};
  };
  internal::send_q(group, result, q, std::move(decompress));
}

CommHook batched_powerSGD(std::shared_ptr<PowerSGDState> state) {
  DDP_CHECK(state != nullptr, "comm_hooks::batched_powerSGD: the state is null");
  return with_state(state, [state](ProcessGroup& group, GradBucket& bucket) {
    return state->run_batched_hook(group, bucket);
  });
}

} // namespace ddp::comm_hooks
