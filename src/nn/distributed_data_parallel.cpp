// DistributedDataParallel: construction (the cross-rank model check and the
// broadcast of rank 0's state), the work around the wrapped module's forward,
// and the debugging aids. The gradient machinery is the Reducer's
// (src/reducer/reducer.cpp).

#include <ddp/nn/distributed_data_parallel.h>

#include <ATen/ATen.h>

#include <sstream>
#include <unordered_set>

#include <ddp/init.h>
#include <ddp/nn/join.h>

#include "internal/check.h"
#include "internal/env.h"
#include "nn/state_sync.h"
#include "reducer/reducer.h"

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

std::string who(const ProcessGroup& group) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] DistributedDataParallel");
}

// What every rank must agree on about one parameter.
struct ParameterSignature {
  std::string name;
  std::string dtype;
  std::string shape;

  bool operator==(const ParameterSignature& other) const {
    return name == other.name && dtype == other.dtype && shape == other.shape;
  }
  std::string describe() const {
    return c10::str("'", name, "' with shape ", shape, " and dtype ", dtype);
  }
};

// One line per parameter: name, dtype, shape separated by tabs.
std::string encode(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) {
    out << names[i] << '\t' << tensors[i].scalar_type() << '\t' << tensors[i].sizes() << '\n';
  }
  return out.str();
}

std::vector<ParameterSignature> decode(const std::string& text) {
  std::vector<ParameterSignature> result;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto a = line.find('\t');
    const auto b = line.find('\t', a + 1);
    result.push_back({line.substr(0, a), line.substr(a + 1, b - a - 1), line.substr(b + 1)});
  }
  return result;
}

// Every rank learns every rank's parameter list; if any differs from rank
// 0's, every rank raises the same error naming the first difference.
void verify_same_parameters(ProcessGroup& group, const std::vector<std::string>& names,
                            const std::vector<at::Tensor>& tensors, c10::Device device) {
  const auto all = internal::allgather_strings(group, encode(names, tensors), device);
  const auto reference = decode(all[0]);
  for (int r = 1; r < group.size(); ++r) {
    const auto theirs = decode(all[r]);
    if (theirs == reference) {
      continue;
    }
    size_t k = 0;
    while (k < theirs.size() && k < reference.size() && theirs[k] == reference[k]) {
      ++k;
    }
    std::string difference;
    if (k < theirs.size() && k < reference.size()) {
      difference = c10::str("parameter ", k, " is ", theirs[k].describe(), " on rank ", r,
                            " but ", reference[k].describe(), " on rank 0");
    } else if (k < reference.size()) {
      difference = c10::str("rank ", r, " has ", theirs.size(), " parameters and rank 0 has ",
                            reference.size(), "; rank 0's parameter ", k, " is ",
                            reference[k].describe());
    } else {
      difference = c10::str("rank ", r, " has ", theirs.size(), " parameters and rank 0 has ",
                            reference.size(), "; rank ", r, "'s parameter ", k, " is ",
                            theirs[k].describe());
    }
    internal::throw_check_error(
        __func__, __FILE__, __LINE__,
        c10::str(who(group), ": the model differs across ranks: ", difference,
                 ". Every rank must wrap the same model: same parameters, in the same order, "
                 "with the same shapes and dtypes."));
  }
}

size_t mebibytes_to_bytes(double mb) {
  return static_cast<size_t>(mb * 1024.0 * 1024.0);
}

} // namespace

// ---- NoSyncGuard ---------------------------------------------------------------------

NoSyncGuard::NoSyncGuard(internal::Reducer* reducer)
    : reducer_(reducer), previous_(reducer->require_sync()) {
  reducer_->set_require_sync(false);
}

NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : reducer_(other.reducer_), previous_(other.previous_) {
  other.reducer_ = nullptr;
}

NoSyncGuard::~NoSyncGuard() {
  if (reducer_ != nullptr) {
    reducer_->set_require_sync(previous_);
  }
}

// ---- Construction --------------------------------------------------------------------

DistributedDataParallelImpl::DistributedDataParallelImpl(detail::Forwarder forwarder,
                                                         std::shared_ptr<torch::nn::Module> module,
                                                         DistributedDataParallelOptions options)
    : forwarder_(std::move(forwarder)),
      module_(std::move(module)),
      options_(std::move(options)) {
  DDP_CHECK(module_ != nullptr,
            "DistributedDataParallel: the module is empty (a default-constructed or moved-from "
            "module holder?)");
  group_ = options_.process_group();
  if (group_ == nullptr) {
    DDP_CHECK(is_initialized(),
              "DistributedDataParallel: there is no process group to reduce over. Call "
              "ddp::init_process_group() before constructing DistributedDataParallel, or pass a "
              "group with DistributedDataParallelOptions().process_group(group).");
    group_ = default_process_group();
  }
  const std::string prefix = who(*group_);
  DDP_CHECK(options_.bucket_cap_mb() > 0, prefix, ": bucket_cap_mb must be positive (got ",
            options_.bucket_cap_mb(), ")");
  DDP_CHECK(options_.first_bucket_cap_mb() > 0, prefix,
            ": first_bucket_cap_mb must be positive (got ", options_.first_bucket_cap_mb(), ")");
  DDP_CHECK(options_.device_ids().size() <= 1, prefix,
            ": device_ids must hold at most one device, this process's (got ",
            options_.device_ids().size(), "); use one process per GPU");
  register_module("module", module_);

  // Parameters, each once even if shared between submodules.
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> all_parameters;
  std::unordered_set<const void*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) {
      continue;
    }
    DDP_CHECK(!p.is_sparse(), prefix, ": parameter '", item.key(),
              "' is sparse; only dense parameters are supported");
    if (!parameters.empty()) {
      DDP_CHECK(p.device() == parameters.front().device(), prefix, ": parameter '", item.key(),
                "' is on ", p.device(), " but '", names.front(), "' is on ",
                parameters.front().device(),
                "; a replica must live on one device (move the module with ->to(device) first)");
    }
    all_parameters.push_back(p);
    if (p.requires_grad()) {
      names.push_back(item.key());
      parameters.push_back(p);
    }
  }
  if (!options_.device_ids().empty() && !all_parameters.empty()) {
    DDP_CHECK(all_parameters.front().device() == options_.device_ids().front(), prefix,
              ": device_ids is {", options_.device_ids().front(), "} but the parameters are on ",
              all_parameters.front().device(), "; move the module there before wrapping it");
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      buffers_.push_back(item.value());
    }
  }

  // Construction is a synchronisation point: agree on the model, then take
  // rank 0's values.
  if (!all_parameters.empty()) {
    device_ = all_parameters.front().device();
  }
  verify_same_parameters(*group_, names, parameters, device_);
  std::vector<at::Tensor> state = all_parameters;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  internal::broadcast_coalesced(*group_, state, 0);

  internal::ReducerConfig config;
  config.first_bucket_bytes = mebibytes_to_bytes(options_.first_bucket_cap_mb());
  config.bucket_bytes = mebibytes_to_bytes(options_.bucket_cap_mb());
  config.find_unused_parameters = options_.find_unused_parameters();
  config.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  config.print_insight = internal::env_get(internal::kEnvDebug).value_or("0") == "1";
  reducer_ = std::make_unique<internal::Reducer>(std::move(parameters), std::move(names), group_,
                                                 config);
}

DistributedDataParallelImpl::~DistributedDataParallelImpl() = default;

// ---- Forward -----------------------------------------------------------------------------

void DistributedDataParallelImpl::pre_forward() {
  forward_start_ = Clock::now();
  if (join_ != nullptr) {
    join_->on_forward(at::GradMode::is_enabled() && reducer_->require_sync());
  }
  reducer_->prepare_for_forward();
  if (options_.broadcast_buffers()) {
    internal::broadcast_coalesced(*group_, buffers_, 0);
  }
}

void DistributedDataParallelImpl::post_forward(const std::vector<at::Tensor>& outputs) {
  if (at::GradMode::is_enabled()) {
    reducer_->prepare_for_backward(outputs);
  }
  reducer_->record_forward_ms(
      std::chrono::duration<double, std::milli>(Clock::now() - forward_start_).count());
}

NoSyncGuard DistributedDataParallelImpl::no_sync() {
  return NoSyncGuard(reducer_.get());
}

void DistributedDataParallelImpl::register_comm_hook(CommHook hook) {
  reducer_->set_comm_hook(std::move(hook));
}

IterationInsight DistributedDataParallelImpl::last_iteration_insight() const {
  return reducer_->last_insight();
}

std::vector<BucketInsight> DistributedDataParallelImpl::bucket_layout() const {
  return reducer_->layout();
}

double DistributedDataParallelImpl::max_parameter_difference_across_ranks() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const auto& p : module_->parameters()) {
    flat.push_back(p.detach().reshape({-1}).to(at::kDouble));
  }
  if (flat.empty() || group_->size() == 1) {
    return 0.0;
  }
  auto mine = at::cat(flat);
  auto reference = mine.clone();
  group_->broadcast(reference, {0})->wait();
  auto difference = (mine - reference).abs().max().reshape({1});
  group_->allreduce(difference, {ReduceOp::kMax})->wait();
  return difference.item<double>();
}

std::string IterationInsight::to_string() const {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << "DDP iteration " << iteration << ": forward " << forward_ms << " ms, backward "
      << backward_compute_ms << " ms, communication " << comm_ms << " ms ("
      << static_cast<int>(overlap_fraction * 100 + 0.5) << "% overlapped with backward), waited "
      << comm_wait_ms << " ms at the end of backward; " << buckets.size() << " bucket(s):";
  for (const auto& bucket : buckets) {
    out << "\n  bucket " << bucket.index << ": " << bucket.parameter_names.size()
        << " parameter(s), " << bucket.bytes << " bytes " << bucket.dtype << ", started at "
        << bucket.launch_ms << " ms, done at " << bucket.done_ms << " ms";
  }
  return out.str();
}

} // namespace ddp
