#include <ddp/comm_hooks/post_local_sgd_hook.h>

#include <ATen/ATen.h>

#include <utility>

#include <ddp/group.h>
#include <ddp/init.h>

#include "comm/objects/object_frame.h"
#include "internal/check.h"
#include "internal/logging.h"

namespace ddp::comm_hooks {

namespace {

constexpr int64_t kPostLocalStateFormat = 1;

// The average of `buffer` over `group`, in place (comm_hooks::allreduce).
std::shared_ptr<Work> average(ProcessGroup& group, const at::Tensor& buffer) {
  if (group.size() == 1) {
    return Work::completed({buffer.is_sparse() ? buffer.coalesce() : buffer});
  }
  buffer.div_(group.size());
  return group.allreduce(buffer);
}

} // namespace

PostLocalSGDState::PostLocalSGDState(std::shared_ptr<ProcessGroup> process_group,
                                     std::shared_ptr<ProcessGroup> subgroup, int64_t start_localSGD_iter,
                                     bool post_local_gradient_allreduce)
    : process_group_(std::move(process_group)),
      subgroup_(std::move(subgroup)),
      start_localSGD_iter_(start_localSGD_iter),
      post_local_gradient_allreduce_(post_local_gradient_allreduce) {
  DDP_CHECK(start_localSGD_iter_ >= 0, "PostLocalSGDState: start_localSGD_iter must not be negative (got ",
            start_localSGD_iter_, ")");
}

std::shared_ptr<Work> PostLocalSGDState::run_hook(ProcessGroup& group, GradBucket& bucket) {
  const at::Tensor& buffer = bucket.buffer();
  if (iteration_ < start_localSGD_iter_) {
    if (bucket.is_last()) {
      ++iteration_;
      if (iteration_ == start_localSGD_iter_) {
        ddp::internal::log_info(c10::str("[rank ", group.rank(), "/", group.size(), "] post_localSGD: local SGD starts after ",
                                         iteration_, " iterations"));
      }
    }
    return average(process_group_ ? *process_group_ : group, buffer);
  }
  if (!post_local_gradient_allreduce_) {
    return Work::completed({buffer});
  }
  if (!subgroup_) {
    // PyTorch's new_subgroups(): one group per node. Every rank reaches this
    // point at the same bucket of the same iteration.
    const int node = world_info_from_env().local_world_size;
    const auto world = default_process_group();
    DDP_CHECK(world != nullptr, "[rank ", group.rank(), "/", group.size(),
              "] post_localSGD: no default group to make the per-node subgroups from; pass a subgroup");
    DDP_CHECK(node >= 1 && world->size() % node == 0, "[rank ", group.rank(), "/", group.size(), "] post_localSGD: ",
              node, " ranks per node (the launcher's local world size, LOCAL_WORLD_SIZE) do not divide the world size ",
              world->size(), "; pass a subgroup to PostLocalSGDState");
    subgroup_ = new_subgroups(node).mine;
  }
  return average(*subgroup_, buffer);
}

std::string PostLocalSGDState::kind() const {
  return "post_localSGD";
}

std::string PostLocalSGDState::save_state() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("format", kPostLocalStateFormat);
  state.insert("iteration", iteration_);
  state.insert("start_localSGD_iter", start_localSGD_iter_);
  state.insert("post_local_gradient_allreduce", post_local_gradient_allreduce_);
  return ddp::internal::encode_ivalue(state);
}

void PostLocalSGDState::load_state(const std::vector<std::string>& saved, int rank, int world_size) {
  const std::string who = c10::str("[rank ", rank, "/", world_size, "] PostLocalSGDState::load_state");
  DDP_CHECK(!saved.empty(), who, ": the checkpoint holds no rank's state");
  // Every rank saved the same count; rank 0's serves a run of another size.
  const int source = static_cast<int>(saved.size()) == world_size ? rank : 0;
  const std::string& bytes = saved[static_cast<size_t>(source)];
  const c10::IValue value = ddp::internal::decode_ivalue(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                         bytes.size(), who, c10::str("rank ", source));
  auto field = [&](const char* key) {
    DDP_CHECK(value.isGenericDict(), who, ": the saved state is a ", value.tagKind(), ", expected a dict");
    const auto dict = value.toGenericDict();
    const auto it = dict.find(key);
    DDP_CHECK(it != dict.end(), who, ": the saved state has no '", key, "'");
    return it->value();
  };
  const c10::IValue format = field("format");
  DDP_CHECK(format.isInt() && format.toInt() == kPostLocalStateFormat, who, ": the saved state has format ", format,
            ", this ddp reads ", kPostLocalStateFormat);
  const c10::IValue start = field("start_localSGD_iter");
  const c10::IValue post = field("post_local_gradient_allreduce");
  const c10::IValue iteration = field("iteration");
  DDP_CHECK(start.isInt() && post.isBool() && iteration.isInt(), who, ": the saved state is malformed");
  DDP_CHECK(start.toInt() == start_localSGD_iter_ && post.toBool() == post_local_gradient_allreduce_, who,
            ": the checkpoint was saved with start_localSGD_iter = ", start.toInt(),
            ", post_local_gradient_allreduce = ", post.toBool(), ", this state has ", start_localSGD_iter_, ", ",
            post_local_gradient_allreduce_, "; resume with the options of the run that saved it");
  iteration_ = iteration.toInt();
}

CommHook post_localSGD(std::shared_ptr<PostLocalSGDState> state) {
  DDP_CHECK(state != nullptr, "comm_hooks::post_localSGD: the state is null");
  return with_state(state, [state](ProcessGroup& group, GradBucket& bucket) {
    return state->run_hook(group, bucket);
  });
}

} // namespace ddp::comm_hooks
