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

#include <ddp/nn/powersgd_hook.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "internal/check.h"

namespace ddp::comm_hooks {

namespace {

// The Work a PowerSGD hook call returns before the collective that completes
// it (the Q allreduce) has been issued. `set_inner` names the Work whose
// success completes this one (its callback calls set_result); if it fails
// instead, `wait` passes its error on, so that DDP's wait does not sit out
// the timeout.
class ChainedWork : public Work {
 public:
  using Work::Work;

  void set_inner(std::shared_ptr<Work> inner) {
    std::lock_guard<std::mutex> lock(inner_mutex_);
    inner_ = std::move(inner);
  }

  void wait(std::chrono::milliseconds timeout) override {
    std::shared_ptr<Work> inner;
    {
      std::lock_guard<std::mutex> lock(inner_mutex_);
      inner = inner_;
    }
    if (inner) {
      try {
        inner->wait(timeout);
      } catch (...) {
        // A timeout of this wait leaves the operation running: only a
        // finished failure completes this Work.
        if (inner->is_completed() && !is_completed()) {
          set_error(std::current_exception());
        }
        throw;
      }
    }
    Work::wait(timeout);
  }

 private:
  std::mutex inner_mutex_;
  std::shared_ptr<Work> inner_; // guarded by inner_mutex_
};

// Makes the columns of `matrix` (k x r) orthonormal in place, as PyTorch's
// _orthogonalize: Gram-Schmidt for r <= 2 (or half precision), else QR.
void orthogonalize(at::Tensor matrix, double epsilon) {
  const int64_t columns = matrix.size(1);
  const bool half = matrix.scalar_type() == at::kHalf || matrix.scalar_type() == at::kBFloat16;
  if (columns > 2 && !half) {
    matrix.copy_(std::get<0>(at::linalg_qr(matrix)));
    return;
  }
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrix.narrow(1, i, 1);
    at::Tensor norm = at::norm(column, 2, {0}, /*keepdim=*/true);
    if (epsilon != 0) {
      norm.add_(epsilon);
    }
    column.div_(norm);
    if (i + 1 < columns) {
      at::Tensor rest = matrix.narrow(1, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, {0}, /*keepdim=*/true) * column);
    }
  }
}

std::string work_name(const ProcessGroup& group, size_t bucket_index) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] powerSGD bucket ", bucket_index);
}

} // namespace

struct PowerSGDState::BucketMemory {
  at::Tensor q;     // flat, every compressed matrix's Q (m x r) back to back
  at::Tensor error; // flat, like the bucket
};

// One bucket between its P allreduce and its Q allreduce.
struct PowerSGDState::InFlight {
  size_t index = 0;
  std::shared_ptr<BucketMemory> memory;
  at::Tensor buffer;     // the bucket: the result is written here
  at::Tensor input_copy; // M before compression (error feedback only)
  at::Tensor first;      // [uncompressed tensors | every P], allreduced together
  int64_t uncompressed_numel = 0;
  std::vector<at::Tensor> uncompressed; // views of buffer
  std::vector<at::Tensor> matrices;     // views of buffer, n x m
  std::vector<at::Tensor> ps;           // views of first, n x r
  std::vector<at::Tensor> qs;           // views of memory->q, m x r
  std::shared_ptr<Work> first_work;
  std::shared_ptr<ChainedWork> result;
};

PowerSGDState::PowerSGDState(PowerSGDOptions options)
    : options_(std::move(options)), seed_rng_(options_.random_seed()) {
  DDP_CHECK(options_.matrix_approximation_rank() >= 1,
            "PowerSGDState: matrix_approximation_rank must be at least 1 (got ",
            options_.matrix_approximation_rank(), ")");
  DDP_CHECK(!(options_.use_error_feedback() || options_.warm_start()) ||
                options_.start_powerSGD_iter() > 1,
            "PowerSGDState: start_powerSGD_iter must be at least 2 with use_error_feedback or "
            "warm_start (got ",
            options_.start_powerSGD_iter(),
            "): DDP rebuilds its buckets after the first iteration, and the error and Q memories "
            "are kept per bucket");
  DDP_CHECK(options_.start_powerSGD_iter() >= 0,
            "PowerSGDState: start_powerSGD_iter must not be negative (got ",
            options_.start_powerSGD_iter(), ")");
  DDP_CHECK(options_.min_compression_rate() >= 0,
            "PowerSGDState: min_compression_rate must not be negative (got ",
            options_.min_compression_rate(), ")");
  DDP_CHECK(options_.orthogonalization_epsilon() >= 0,
            "PowerSGDState: orthogonalization_epsilon must not be negative (got ",
            options_.orthogonalization_epsilon(), ")");
}

PowerSGDState::~PowerSGDState() = default;

PowerSGDCompressionStats PowerSGDState::compression_stats() const {
  PowerSGDCompressionStats stats;
  stats.numel_before = numel_before_.load();
  stats.numel_after = numel_after_.load();
  if (stats.numel_after > 0) {
    stats.rate = static_cast<double>(stats.numel_before) / static_cast<double>(stats.numel_after);
  }
  return stats;
}

at::Tensor PowerSGDState::error(size_t bucket_index) const {
  auto it = memories_.find(bucket_index);
  return it == memories_.end() ? at::Tensor() : it->second->error;
}

// PyTorch draws each initialisation's torch seed with NumPy's legacy
// RandomState(random_seed).randint(1_000_000_000): MT19937 seeded as
// std::mt19937 is, 32-bit draws masked to 30 bits, values over the bound
// rejected.
uint32_t PowerSGDState::next_seed() {
  constexpr uint32_t kMax = 1'000'000'000 - 1;
  constexpr uint32_t kMask = (1u << 30) - 1;
  uint32_t value = 0;
  do {
    value = static_cast<uint32_t>(seed_rng_()) & kMask;
  } while (value > kMax);
  return value;
}

std::shared_ptr<Work> PowerSGDState::plain_allreduce(ProcessGroup& group, GradBucket& bucket) {
  const at::Tensor& buffer = bucket.buffer();
  bytes_allreduced_ += static_cast<uint64_t>(buffer.nbytes());
  ++allreduce_calls_;
  if (group.size() == 1) {
    return Work::completed({buffer.is_sparse() ? buffer.coalesce() : buffer});
  }
  buffer.div_(group.size());
  return group.allreduce(buffer);
}

std::shared_ptr<Work> PowerSGDState::run_hook(ProcessGroup& group, GradBucket& bucket) {
  const int64_t iteration = iteration_.load();
  if (iteration < options_.start_powerSGD_iter() || bucket.buffer().is_sparse()) {
    // PyTorch's PowerSGD takes no sparse gradient; ours averages it plainly.
    if (bucket.is_last()) {
      ++iteration_;
    }
    return plain_allreduce(group, bucket);
  }
  const size_t index = bucket.index();
  auto& memory = memories_[index];
  if (!memory) {
    memory = std::make_shared<BucketMemory>();
  }
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

  int64_t p_numel = 0;
  int64_t q_numel = 0;
  for (const auto& [shape, matrices] : by_shape) {
    const int64_t r = std::min({shape.first, shape.second, options_.matrix_approximation_rank()});
    for (const auto& matrix : matrices) {
      current->matrices.push_back(matrix);
      p_numel += shape.first * r;
      q_numel += shape.second * r;
    }
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
    for (const auto& matrix : current->matrices) {
      const int64_t n = matrix.size(0);
      const int64_t m = matrix.size(1);
      const int64_t r = std::min({n, m, options_.matrix_approximation_rank()});
      current->ps.push_back(current->first.narrow(0, p_offset, n * r).view({n, r}));
      current->qs.push_back(memory->q.narrow(0, q_offset, m * r).view({m, r}));
      p_offset += n * r;
      q_offset += m * r;
    }
  }
  if (randomize && q_numel > 0) {
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
    at::mm_out(current->ps[k], current->matrices[k], current->qs[k]);
  }
  bytes_allreduced_ += static_cast<uint64_t>(current->first.nbytes());
  ++allreduce_calls_;
  current->first_work =
      group.size() == 1 ? Work::completed({current->first}) : group.allreduce(current->first);
  current->result = std::make_shared<ChainedWork>(work_name(group, index), group.timeout());
  std::shared_ptr<Work> result = current->result;

  // See Note [PowerSGD collective order].
  if (in_flight_) {
    auto previous = std::move(in_flight_);
    if (previous->index < index) {
      finish(group, *previous);
    } else {
      // An iteration that ended early (backward threw): nobody waits for it.
      previous->result->set_error(std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          c10::str(work_name(group, previous->index),
                   ": abandoned, its iteration ended before the next bucket was launched"))));
    }
  }
  if (bucket.is_last()) {
    finish(group, *current);
    ++iteration_;
  } else {
    in_flight_ = std::move(current);
  }
  return result;
}

void PowerSGDState::finish(ProcessGroup& group, InFlight& bucket) {
  const auto result = bucket.result;
  try {
    bucket.first_work->wait();
  } catch (...) {
    result->set_error(std::current_exception());
    return;
  }
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
                     input_copy = bucket.input_copy, matrices = bucket.matrices, ps = bucket.ps,
                     qs = bucket.qs, warm_start = options_.warm_start()](
                        const std::vector<at::Tensor>&) {
    // Step 6. Runs on the process group's thread (or here, in a world of
    // size 1).
    if (memory->q.defined()) {
      memory->q.div_(world_size);
    }
    for (size_t k = 0; k < matrices.size(); ++k) {
      at::Tensor m = matrices[k];
      at::mm_out(m, ps[k], qs[k].t());
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
    at::mm_out(bucket.qs[k], bucket.matrices[k].t(), bucket.ps[k]);
  }
  const at::Tensor& q = bucket.memory->q;
  bytes_allreduced_ += static_cast<uint64_t>(q.nbytes());
  ++allreduce_calls_;
  std::shared_ptr<Work> second;
  try {
    second = world_size == 1 ? Work::completed({q}) : group.allreduce(q);
  } catch (...) {
    result->set_error(std::current_exception());
    return;
  }
  result->set_inner(second->then(std::move(decompress)));
}

CommHook powerSGD(std::shared_ptr<PowerSGDState> state) {
  DDP_CHECK(state != nullptr, "comm_hooks::powerSGD: the state is null");
  return [state = std::move(state)](ProcessGroup& group, GradBucket& bucket) {
    return state->run_hook(group, bucket);
  };
}

} // namespace ddp::comm_hooks
