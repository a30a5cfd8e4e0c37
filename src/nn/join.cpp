// Join: how a rank that ran out of data keeps the others going.
//
// Every forward of a rank still training starts with a *join allreduce* of a
// *step vector* [reduces gradients, broadcasts buffers, training_0, ...,
// training_{W-1}]: a rank still training sets its own training_r and the
// two flags of its step; a rank in `finish()` contributes zeros. The sum
// tells every rank which ranks still train and what this step does. The
// highest rank still training is the *authoritative rank*: buffers are
// broadcast from it, since a finished rank's are stale (PyTorch's
// `_find_common_rank`). While some rank trains, a finished rank *shadows*
// the step: the same collectives in the same order (bucket rebuild if due,
// buffer broadcast, one allreduce of zeros per bucket through the
// communication hook, and its last parameter usage; see
// Reducer::shadow_backward). When no rank trains, the parameters and buffers
// of the rank that trained the most steps are broadcast to all.
//
// JoinOptions: with divide_by_initial_world_size(false), the step vector's
// count of ranks still training becomes the built-in allreduce's divisor for
// that step (Reducer::set_divisor); with throw_on_early_termination, a step
// vector that shows a finished rank makes every rank throw at that same
// allreduce, so that no collective is left half-issued and the group stays
// usable.

#include <ddp/comm/error.h>
#include <ddp/nn/join.h>

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <vector>

#include "comm/collective_label.h"
#include "internal/check.h"
#include "internal/logging.h"
#include "nn/ddp_state.h"
#include "nn/state_sync.h"
#include "reducer/reducer.h"

namespace ddp {

namespace {

// "[rank 1/4] ddp::Join: ", the start of Join's messages.
std::string who_of(const ProcessGroup& group) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] ddp::Join: ");
}

// What the ranks still training do in one step, from the join allreduce.
struct JoinStep {
  int training = 0;            // ranks still training
  int authoritative_rank = -1; // the highest of them
  std::vector<int> finished;   // the others
  bool sync_gradients = false;
  bool sync_buffers = false;
};

// The join allreduce (a collective: every rank calls it once per step of
// the ranks still training, and once more when all have finished).
JoinStep agree_on_step(ProcessGroup& group, c10::Device device, bool training,
                       bool sync_gradients, bool sync_buffers) {
  const int size = group.size();
  auto vector = at::zeros({2 + size}, at::kInt);
  if (training) {
    auto* flags = vector.data_ptr<int>();
    flags[0] = sync_gradients ? 1 : 0;
    flags[1] = sync_buffers ? 1 : 0;
    flags[2 + group.rank()] = 1;
  }
  vector = vector.to(device);
  internal::CollectiveLabel label("Join: who is still training");
  group.allreduce(vector)->wait();
  vector = vector.cpu();
  const auto* sums = vector.data_ptr<int>();
  JoinStep step;
  for (int r = 0; r < size; ++r) {
    if (sums[2 + r] > 0) {
      ++step.training;
      step.authoritative_rank = r;
    } else {
      step.finished.push_back(r);
    }
  }
  // Every rank sees the same sums, so every rank raises together.
  const auto who = who_of(group);
  DDP_CHECK(sums[0] == 0 || sums[0] == step.training, who, sums[0], " of the ", step.training,
            " ranks still training reduce gradients in this step, expected all or none: the "
            "ranks still training must use no_sync() and gradient mode in the same steps");
  DDP_CHECK(sums[1] == 0 || sums[1] == step.training, who, sums[1], " of the ", step.training,
            " ranks still training broadcast buffers in this step, expected all or none: the "
            "ranks still training must use no_sync() and gradient mode in the same steps");
  step.sync_gradients = sums[0] > 0;
  step.sync_buffers = sums[1] > 0;
  return step;
}

} // namespace

Join::Join(DistributedDataParallel& model, const JoinOptions& options)
    : model_(model), options_(options), uncaught_at_start_(std::uncaught_exceptions()) {
  if (!options_.enable()) {
    return;
  }
  DDP_CHECK(model_->state_->join == nullptr,
            "ddp::Join: this DistributedDataParallel already has a live Join");
  DDP_CHECK(!model_->state_->reducer->has_bucket_consumer(),
            "ddp::Join: this DistributedDataParallel runs a ZeroRedundancyOptimizer's steps during "
            "backward (overlap_with_ddp), which a joined rank cannot shadow; use the optimizer "
            "without overlap_with_ddp under Join");
  model_->state_->join = this;
}

Join::~Join() noexcept {
  if (finished_ || !options_.enable()) {
    return;
  }
  model_->state_->join = nullptr;
  model_->state_->reducer->set_divisor(0);
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    return; // unwinding from an error: taking part now could only deadlock
  }
  try {
    finish();
  } catch (const std::exception& e) {
    internal::log_warning(c10::str("ddp::Join: finishing failed: ", error_message(e)));
  }
}

int Join::on_forward(bool will_sync_gradients, bool will_sync_buffers) {
  const JoinStep step = agree_on_step(*model_->state_->group, model_->device(), /*training=*/true,
                                      will_sync_gradients, will_sync_buffers);
  DDP_CHECK(!options_.throw_on_early_termination() || step.finished.empty(), who_of(*model_->state_->group),
            "detected that rank(s) ", c10::Join(", ", step.finished),
            " exhausted their inputs after this rank's ", steps_trained_,
            " steps; with throw_on_early_termination every rank throws (the ranks' inputs are uneven)");
  model_->state_->reducer->set_divisor(options_.divide_by_initial_world_size() ? 0 : step.training);
  ++steps_trained_;
  return step.authoritative_rank;
}

int64_t Join::finish() {
  DDP_CHECK(!finished_, "ddp::Join: finish() was already called");
  finished_ = true;
  if (!options_.enable()) {
    return 0;
  }
  model_->state_->join = nullptr;
  auto& impl = *model_;
  impl.state_->reducer->set_divisor(0);
  ProcessGroup& group = *impl.state_->group;
  int64_t shadowed = 0;
  for (;;) {
    const JoinStep step = agree_on_step(group, impl.device(), /*training=*/false, false, false);
    if (step.training == 0) {
      break;
    }
    DDP_CHECK(!options_.throw_on_early_termination(), who_of(group), "this rank exhausted its inputs after ",
              steps_trained_, " steps while ", step.training,
              " rank(s) still train; with throw_on_early_termination every rank throws (the ranks' "
              "inputs are uneven)");
    // The same collectives as a training rank's forward and backward.
    impl.state_->reducer->prepare_for_forward();
    if (step.sync_buffers) {
      internal::broadcast_coalesced(group, impl.state_->buffers, step.authoritative_rank,
                                    internal::VersionCounters::kPreserve);
    }
    if (step.sync_gradients) {
      impl.state_->reducer->shadow_backward();
    }
    // As the ranks still training: their next forward broadcasts buffers
    // only if this one synchronised.
    impl.state_->last_forward_synchronised = step.sync_gradients;
    ++shadowed;
  }
  // Everyone takes the parameters of the rank that trained longest (the
  // highest such rank on a tie).
  auto key = at::full({1}, steps_trained_ * group.size() + group.rank(),
                      at::TensorOptions(at::kLong).device(impl.device()));
  internal::CollectiveLabel label("Join: the longest-trained rank's state");
  group.allreduce(key, {ReduceOp::kMax})->wait();
  const int source = static_cast<int>(key.item<int64_t>() % group.size());
  std::vector<at::Tensor> state;
  for (const auto& p : impl.module_->parameters()) {
    state.push_back(p);
  }
  state.insert(state.end(), impl.state_->buffers.begin(), impl.state_->buffers.end());
  internal::broadcast_coalesced(group, state, source);
  return shadowed;
}

} // namespace ddp
