// Join: how a rank that ran out of data keeps the others going.
//
// Every forward of a rank still training starts with a *join allreduce* of
// [1, will_sync]. A rank in `finish()` contributes [0, 0] instead, so the sum
// tells it how many ranks still train and whether they will reduce gradients
// this step. While some do, it *shadows* their step: the same collectives in
// the same order (bucket rebuild if due, buffer broadcast, one allreduce of
// zeros per bucket through the communication hook, usage counts). When the
// sum is 0 every rank has finished; the parameters of the rank that trained
// the most steps are then broadcast to all.

#include <ddp/nn/join.h>

#include <ATen/ATen.h>

#include <exception>

#include "internal/check.h"
#include "internal/logging.h"
#include "nn/state_sync.h"
#include "reducer/reducer.h"

namespace ddp {

Join::Join(DistributedDataParallel& model)
    : model_(model), uncaught_at_start_(std::uncaught_exceptions()) {
  DDP_CHECK(model_->join_ == nullptr,
            "ddp::Join: this DistributedDataParallel already has a live Join");
  model_->join_ = this;
}

Join::~Join() noexcept {
  if (finished_) {
    return;
  }
  model_->join_ = nullptr;
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    return; // unwinding from an error: taking part now could only deadlock
  }
  try {
    finish();
  } catch (const std::exception& e) {
    internal::log_warning(c10::str("ddp::Join: finishing failed: ", e.what()));
  }
}

void Join::on_forward(bool will_sync) {
  auto counts = at::tensor({1, will_sync ? 1 : 0}, at::kInt).to(model_->device());
  model_->group_->allreduce(counts)->wait();
  ++steps_trained_;
}

int64_t Join::finish() {
  DDP_CHECK(!finished_, "ddp::Join: finish() was already called");
  finished_ = true;
  model_->join_ = nullptr;
  auto& impl = *model_;
  ProcessGroup& group = *impl.group_;
  int64_t shadowed = 0;
  for (;;) {
    auto counts = at::zeros({2}, at::TensorOptions(at::kInt).device(impl.device()));
    group.allreduce(counts)->wait();
    counts = counts.cpu();
    if (counts[0].item<int>() == 0) {
      break;
    }
    // The same collectives as a training rank's forward and backward.
    impl.reducer_->prepare_for_forward();
    if (impl.options_.broadcast_buffers()) {
      internal::broadcast_coalesced(group, impl.buffers_, 0);
    }
    if (counts[1].item<int>() > 0) {
      impl.reducer_->shadow_backward();
    }
    ++shadowed;
  }
  // Everyone takes the parameters of the rank that trained longest (the
  // highest such rank on a tie).
  auto key = at::full({1}, steps_trained_ * group.size() + group.rank(),
                      at::TensorOptions(at::kLong).device(impl.device()));
  group.allreduce(key, {ReduceOp::kMax})->wait();
  const int source = static_cast<int>(key.item<int64_t>() % group.size());
  std::vector<at::Tensor> state;
  for (const auto& p : impl.module_->parameters()) {
    state.push_back(p);
  }
  state.insert(state.end(), impl.buffers_.begin(), impl.buffers_.end());
  internal::broadcast_coalesced(group, state, source);
  return shadowed;
}

} // namespace ddp
