// How it works
//
// Batch normalisation needs, per channel c, the mean and the (biased)
// variance of the batch. SyncBatchNorm's batch is the concatenation of the
// ranks' batches, so in a training forward each rank r computes its own
// count n_r (elements per channel: batch x spatial), mean m_r and sum of
// squared deviations M2_r (n_r times its biased variance), and one
// allgather_into_tensor gives every rank all of them, [n_r, m_r, M2_r] per
// rank in double (exact counts; the combination below subtracts nothing
// large). Every rank then combines them the same way (Chan's parallel
// variance):
//
//   n    = sum_r n_r
//   mean = sum_r n_r m_r / n
//   M2   = sum_r (M2_r + n_r (m_r - mean)^2)
//   var  = M2 / n,  invstd = 1 / sqrt(var + eps)
//
// A rank with an empty batch sends n_r = 0, m_r = M2_r = 0, which adds
// nothing: uneven and empty batches need no masking. The output is
// (x - mean) * invstd * weight + bias. The running statistics move towards
// mean and the unbiased M2 / (n - 1), as BatchNorm's do, so they are the same
// on every rank.
//
// Backward (SyncBatchNormFunction::backward, on the autograd engine thread):
// with dy the output's gradient and xmu = x - mean, the input's gradient is
//
//   dx = weight * invstd * (dy - sum_dy / n - xmu * invstd^2 * sum_dy_xmu / n)
//
// where sum_dy and sum_dy_xmu are sums over the whole group's batch: each
// rank sums its own, and one allreduce of [sum_dy, sum_dy_xmu] adds them
// (PyTorch's batch_norm_backward_reduce and batch_norm_backward_elemt). The
// parameters' gradients are this rank's sums (dweight = sum_dy_xmu * invstd,
// dbias = sum_dy), which DistributedDataParallel then averages. An empty
// rank allreduces zeros. The allreduce is issued only when the input needs a
// gradient, which depends on the model, not the data, so every rank issues
// it or none does.
//
// Eval mode, and a group of one rank, call torch::nn::functional::batch_norm
// exactly as torch::nn::BatchNorm does: no communication.

#include <ddp/nn/sync_batch_norm.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ddp/init.h>

#include "comm/collective_label.h"
#include "internal/check.h"
#include "nn/sync_batch_norm_internal.h"

namespace ddp::nn {

namespace {

std::string who(const ProcessGroup& group) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] SyncBatchNorm");
}

// The dimensions that a channel's statistics reduce over: all but 1.
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) {
    dims.push_back(d);
  }
  return dims;
}

// Shape of a per-channel vector broadcast against the input: (1, C, 1, ...).
std::vector<int64_t> channel_shape(const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return shape;
}

// Element-wise arithmetic runs in float for Half, BFloat16 and Float, in
// double for Double (ATen's batch norm kernels do the same).
at::ScalarType compute_type(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The group travels to backward inside the autograd context, whose saved
// data are IValues; a capsule is the IValue that holds an arbitrary C++
// object (ProcessGroup is not a TorchScript class).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<ProcessGroup> group) : group(std::move(group)) {}
  std::shared_ptr<ProcessGroup> group;
};

// What the training forward needs besides its differentiable inputs.
struct SyncSettings {
  std::shared_ptr<ProcessGroup> group;
  // Undefined when the running statistics are not tracked.
  at::Tensor running_mean;
  at::Tensor running_var;
  double momentum = 0.1; // the factor of this step (1 / k for the cumulative average)
  double eps = 1e-5;
  std::string name; // the layer's, for its collectives' label
};

// "SyncBatchNorm 'generator.batch_norm1' forward": its collectives' label.
std::string label_of(const std::string& name, const char* pass) {
  return name.empty() ? c10::str("SyncBatchNorm ", pass) : c10::str("SyncBatchNorm '", name, "' ", pass);
}

// The training forward and backward over the group; see "How it works".
// weight and bias are optional so that the custom Function machinery
// tracks them only when defined (affine).
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input,
                            const c10::optional<at::Tensor>& weight,
                            const c10::optional<at::Tensor>& bias, const SyncSettings& settings) {
    ProcessGroup& group = *settings.group;
    const at::Tensor x = input.contiguous();
    const int64_t channels = x.size(1);
    const int64_t local_count = x.numel() / channels; // channels > 0: checked by the module
    const auto type = compute_type(x);
    const auto dims = reduced_dims(x);
    const auto shape = channel_shape(x);
    const auto doubles = x.options().dtype(at::kDouble);

    // This rank's [n_r, m_r (C), M2_r (C)], gathered from every rank.
    auto mine = at::zeros({1 + 2 * channels}, doubles);
    if (local_count > 0) {
      auto var_mean = at::var_mean(x.to(type), dims, /*unbiased=*/false, /*keepdim=*/false);
      mine[0] = static_cast<double>(local_count);
      mine.narrow(0, 1, channels).copy_(std::get<1>(var_mean));
      mine.narrow(0, 1 + channels, channels)
          .copy_(std::get<0>(var_mean).to(at::kDouble) * static_cast<double>(local_count));
    }
    auto gathered = at::empty({group.size() * (1 + 2 * channels)}, doubles);
    {
      internal::CollectiveLabel label(label_of(settings.name, "forward"));
      group.allgather_into_tensor(gathered, mine)->wait();
    }
    gathered = gathered.view({group.size(), 1 + 2 * channels});
    const auto counts = gathered.narrow(1, 0, 1);             // (W, 1)
    const auto means = gathered.narrow(1, 1, channels);       // (W, C)
    const auto m2s = gathered.narrow(1, 1 + channels, channels);
    const double count = counts.sum().item<double>();

    context->saved_data["group"] =
        c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(settings.group));
    context->saved_data["count"] = count;
    context->saved_data["name"] = settings.name;
    context->saved_data["input_requires_grad"] = input.requires_grad();
    if (count == 0) {
      // Every rank's batch is empty, so every rank is here: as BatchNorm on
      // an empty batch, an empty output and the statistics left alone.
      context->save_for_backward({x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()),
                                  at::Tensor(), at::Tensor()});
      return at::empty_like(input);
    }
    DDP_CHECK(count > 1, who(group),
              ": expected more than 1 value per channel when training, got 1 in the whole "
              "group (input of shape ", input.sizes(), " on this rank)");

    const auto mean = (counts * means).sum(0) / count;
    const auto m2 = m2s.sum(0) + (counts * (means - mean).square()).sum(0);
    const auto var = m2 / count;
    const auto invstd = (var + settings.eps).rsqrt();

    if (settings.running_mean.defined()) {
      const double m = settings.momentum;
      auto& running_mean = settings.running_mean;
      auto& running_var = settings.running_var;
      running_mean.copy_(running_mean.to(at::kDouble) * (1 - m) + mean * m);
      running_var.copy_(running_var.to(at::kDouble) * (1 - m) + (m2 / (count - 1)) * m);
    }

    // y = x * scale + shift, per channel.
    auto scale = invstd;
    auto shift = -mean * invstd;
    if (weight.has_value()) {
      scale = scale * weight->to(at::kDouble);
      shift = shift * weight->to(at::kDouble);
    }
    if (bias.has_value()) {
      shift = shift + bias->to(at::kDouble);
    }
    auto output = (x.to(type) * scale.to(type).view(shape) + shift.to(type).view(shape))
                      .to(input.scalar_type());

    context->save_for_backward({x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()),
                                mean.to(type), invstd.to(type)});
    return output;
  }

  // Runs on the autograd engine thread; the allreduce is a collective (see
  // "How it works" for why every rank issues it or none does).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list gradients) {
    const auto saved = context->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& bias = saved[2];
    auto group = c10::static_intrusive_pointer_cast<GroupCapsule>(
                     context->saved_data["group"].toCapsule())
                     ->group;
    DDP_CHECK(!at::GradMode::is_enabled(), who(*group),
              ": double backward (create_graph=true) is not supported");
    const double count = context->saved_data["count"].toDouble();
    const bool needs_input = context->saved_data["input_requires_grad"].toBool();
    const bool needs_weight = weight.defined() && weight.requires_grad();
    const bool needs_bias = bias.defined() && bias.requires_grad();
    const int64_t channels = x.size(1);

    at::Tensor grad_input;
    at::Tensor grad_weight;
    at::Tensor grad_bias;
    if (count == 0) {
      // Every rank's batch was empty; no rank communicates.
      if (needs_input) {
        grad_input = at::zeros_like(x);
      }
      if (needs_weight) {
        grad_weight = at::zeros_like(weight);
      }
      if (needs_bias) {
        grad_bias = at::zeros_like(bias);
      }
      return {grad_input, grad_weight, grad_bias, at::Tensor()};
    }

    const at::Tensor& mean = saved[3];
    const at::Tensor& invstd = saved[4];
    const auto type = mean.scalar_type();
    const auto dims = reduced_dims(x);
    const auto shape = channel_shape(x);
    const auto dy = gradients[0].contiguous().to(type);
    const auto xmu = x.to(type) - mean.view(shape);
    const auto invstd_d = invstd.to(at::kDouble);

    // This rank's [sum_dy, sum_dy_xmu], in double, as one tensor for the
    // allreduce.
    auto sums = at::zeros({2 * channels}, x.options().dtype(at::kDouble));
    if (x.numel() > 0) {
      sums.narrow(0, 0, channels).copy_(dy.sum(dims));
      sums.narrow(0, channels, channels).copy_((dy * xmu).sum(dims));
    }
    // The parameters' gradients from this rank's sums (before the allreduce
    // overwrites them).
    if (needs_weight) {
      grad_weight = (sums.narrow(0, channels, channels) * invstd_d).to(weight.scalar_type());
    }
    if (needs_bias) {
      grad_bias = sums.narrow(0, 0, channels).to(bias.scalar_type(), /*non_blocking=*/false,
                                                 /*copy=*/true);
    }

    if (needs_input) {
      internal::CollectiveLabel label(label_of(context->saved_data["name"].toStringRef(), "backward"));
      group->allreduce(sums)->wait();
      const auto mean_dy = sums.narrow(0, 0, channels) / count;
      const auto mean_dy_xmu = sums.narrow(0, channels, channels) / count;
      // dx = k * dy + xmu_factor * xmu + constant, per channel.
      auto k = invstd_d;
      if (weight.defined()) {
        k = k * weight.to(at::kDouble);
      }
      const auto xmu_factor = -k * invstd_d.square() * mean_dy_xmu;
      const auto constant = -k * mean_dy;
      grad_input = (dy * k.to(type).view(shape) + xmu * xmu_factor.to(type).view(shape) +
                    constant.to(type).view(shape))
                       .to(x.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor()};
  }
};

void check_options(const SyncBatchNormOptions& options) {
  DDP_CHECK(options.num_features() > 0,
            "SyncBatchNorm: num_features must be positive (got ", options.num_features(), ")");
  DDP_CHECK(options.eps() >= 0, "SyncBatchNorm: eps must not be negative (got ", options.eps(), ")");
}

template <typename BatchNormHolder>
detail::BatchNormState take_over(const BatchNormHolder& batch_norm,
                                 std::shared_ptr<ProcessGroup> process_group) {
  return {SyncBatchNormOptions(batch_norm->options).process_group(std::move(process_group)),
          batch_norm->weight,
          batch_norm->bias,
          batch_norm->running_mean,
          batch_norm->running_var,
          batch_norm->num_batches_tracked,
          batch_norm->is_training()};
}

} // namespace

at::Tensor detail::sync_batch_norm_training(const at::Tensor& input, const at::Tensor& weight,
                                            const at::Tensor& bias, const at::Tensor& running_mean,
                                            const at::Tensor& running_var, double momentum, double eps,
                                            std::shared_ptr<ProcessGroup> group, const std::string& name) {
  SyncSettings settings;
  settings.group = std::move(group);
  settings.running_mean = running_mean;
  settings.running_var = running_var;
  settings.momentum = momentum;
  settings.eps = eps;
  settings.name = name;
  auto optional = [](const at::Tensor& t) {
    return t.defined() ? c10::optional<at::Tensor>(t) : c10::optional<at::Tensor>();
  };
  return SyncBatchNormFunction::apply(input, optional(weight), optional(bias), settings);
}

// ---- SyncBatchNormOptions ------------------------------------------------------------

SyncBatchNormOptions::SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}

SyncBatchNormOptions::SyncBatchNormOptions(const torch::nn::BatchNormOptions& options)
    : num_features_(options.num_features()),
      eps_(options.eps()),
      momentum_(options.momentum()),
      affine_(options.affine()),
      track_running_stats_(options.track_running_stats()) {}

// ---- SyncBatchNormImpl ---------------------------------------------------------------

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options) : options(std::move(options)) {
  check_options(this->options);
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNorm1d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group)
    : SyncBatchNormImpl(take_over(batch_norm, std::move(process_group))) {}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNorm2d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group)
    : SyncBatchNormImpl(take_over(batch_norm, std::move(process_group))) {}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNorm3d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group)
    : SyncBatchNormImpl(take_over(batch_norm, std::move(process_group))) {}

// Registers the BatchNorm's own tensors under the same names, in the same
// order as reset(); register_parameter sets requires_grad to the value the
// tensor already has.
SyncBatchNormImpl::SyncBatchNormImpl(detail::BatchNormState state)
    : options(std::move(state.options)) {
  check_options(options);
  weight = register_parameter("weight", state.weight,
                              state.weight.defined() && state.weight.requires_grad());
  bias = register_parameter("bias", state.bias, state.bias.defined() && state.bias.requires_grad());
  running_mean = register_buffer("running_mean", state.running_mean);
  running_var = register_buffer("running_var", state.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", state.num_batches_tracked);
  train(state.training);
}

void SyncBatchNormImpl::reset() {
  const int64_t n = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({n}));
    bias = register_parameter("bias", torch::empty({n}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({n}));
    running_var = register_buffer("running_var", torch::ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::nn::init::ones_(weight);
    torch::nn::init::zeros_(bias);
  }
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  DDP_CHECK(input.dim() >= 2,
            "SyncBatchNorm: expected an input of at least 2 dimensions (batch, channels, ...), got ",
            input.dim(), "-D input");
  DDP_CHECK(input.size(1) == options.num_features(), "SyncBatchNorm: expected ",
            options.num_features(), " channels in dimension 1 of the input, got input of shape ",
            input.sizes());

  // The group first, so that a missing default group changes nothing.
  std::shared_ptr<ProcessGroup> group;
  if (is_training()) {
    group = options.process_group() ? options.process_group() : default_process_group();
  }

  // The momentum of this step, as torch::nn::BatchNorm computes it.
  double momentum = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) {
      momentum = 1.0 / num_batches_tracked.item<double>();
    }
  }

  if (!group || group->size() == 1) {
    namespace F = torch::nn::functional;
    return F::batch_norm(input, running_mean, running_var,
                         F::BatchNormFuncOptions()
                             .weight(weight)
                             .bias(bias)
                             .training(is_training() || !options.track_running_stats())
                             .momentum(momentum)
                             .eps(options.eps()));
  }

  const bool tracked = options.track_running_stats();
  return detail::sync_batch_norm_training(input, weight, bias, tracked ? running_mean : torch::Tensor(),
                                          tracked ? running_var : torch::Tensor(), momentum, options.eps(),
                                          std::move(group), name_in_model);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "ddp::nn::SyncBatchNorm(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum().has_value()) {
    stream << options.momentum().value();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

// ---- convert_sync_batchnorm ----------------------------------------------------------

namespace {

// The SyncBatchNorm that takes over `module`, or nullptr when it is not a
// BatchNorm.
std::shared_ptr<SyncBatchNormImpl> take_over_if_batch_norm(
    const std::shared_ptr<torch::nn::Module>& module, const std::shared_ptr<ProcessGroup>& group) {
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) {
    return std::make_shared<SyncBatchNormImpl>(torch::nn::BatchNorm1d(bn), group);
  }
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) {
    return std::make_shared<SyncBatchNormImpl>(torch::nn::BatchNorm2d(bn), group);
  }
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) {
    return std::make_shared<SyncBatchNormImpl>(torch::nn::BatchNorm3d(bn), group);
  }
  return nullptr;
}

bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

// The containers whose forward (or indexing) reads their own storage, which
// convert() updates along with the registered children.
bool is_container(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&module) != nullptr;
}

// "torch::nn::BatchNorm2d" for a BatchNorm2dImpl: the holder users write.
std::string holder_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const std::string impl = "Impl";
  if (name.size() > impl.size() && name.compare(name.size() - impl.size(), impl.size(), impl) == 0) {
    name.resize(name.size() - impl.size());
  }
  return name;
}

std::string child_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Checks, before anything changes, what a BatchNorm registered directly in
// a module that is not a container needs: that module's forward calls its
// own typed member, which C++ cannot point at another module, so the layer
// is synchronised where it stands (Note [BatchNorms synchronised in place],
// batch_norm_in_place.cpp), which needs a tensor of its own to know it by
// and the dispatcher's hook.
void check_convertible(const torch::nn::Module& module, const std::string& path) {
  for (const auto& child : module.named_children()) {
    const auto name = child_path(path, child.key());
    if (!is_batch_norm(*child.value())) {
      check_convertible(*child.value(), name);
      continue;
    }
    if (is_container(module)) {
      continue;
    }
    DDP_CHECK(detail::can_synchronise_in_place(*child.value()), "convert_sync_batchnorm: '", name, "' is a ",
              holder_name(*child.value()), " registered directly in the custom module ",
              (path.empty() ? std::string() : "'" + path + "' "), "(", module.name(),
              "), which is synchronised where it stands, known by its weight or its running mean; this "
              "one has neither (affine=false, track_running_stats=false), so its calls cannot be told "
              "from others'. Declare the member as ddp::nn::SyncBatchNorm (it takes the BatchNorm's "
              "options and loads its checkpoints), or hold the layer in a Sequential, ModuleList or "
              "ModuleDict");
    detail::install_batch_norm_hook(name);
  }
}

// Replaces, in a container, every entry that is `old` by `replacement`.
void replace_in_storage(torch::nn::Module& container, const torch::nn::Module* old,
                        const std::shared_ptr<SyncBatchNormImpl>& replacement) {
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&container)) {
    for (auto& entry : *sequential) {
      if (entry.ptr().get() == old) {
        entry = torch::nn::AnyModule(SyncBatchNorm(replacement));
      }
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&container)) {
    for (auto& entry : *list) {
      if (entry.get() == old) {
        entry = replacement;
      }
    }
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&container)) {
    for (auto& entry : *dict) {
      if (entry.value().get() == old) {
        entry.value() = replacement;
      }
    }
  }
}

// A BatchNorm that appears at several places of the tree (one module
// registered twice) becomes one SyncBatchNorm.
using Replacements = std::unordered_map<const torch::nn::Module*, std::shared_ptr<SyncBatchNormImpl>>;

void convert(torch::nn::Module& module, const std::string& path, const std::shared_ptr<ProcessGroup>& group,
             Replacements& replacements) {
  for (const auto& child : module.named_children()) {
    const torch::nn::Module* old = child.value().get();
    if (!is_batch_norm(*old)) {
      convert(*child.value(), child_path(path, child.key()), group, replacements);
      continue;
    }
    if (!is_container(module)) {
      // Its module's forward calls it by its typed member: it stays, and
      // normalises over the group from now on (check_convertible).
      detail::synchronise_in_place(child.value(), group, child_path(path, child.key()));
      continue;
    }
    auto& replacement = replacements[old];
    if (!replacement) {
      replacement = take_over_if_batch_norm(child.value(), group);
      replacement->name_in_model = child_path(path, child.key());
    }
    replace_in_storage(module, old, replacement);
    module.replace_module(child.key(), replacement);
  }
}

} // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const std::shared_ptr<torch::nn::Module>& module,
    std::shared_ptr<ProcessGroup> process_group) {
  DDP_CHECK(module != nullptr, "convert_sync_batchnorm: the module is null");
  if (auto replacement = take_over_if_batch_norm(module, process_group)) {
    return replacement;
  }
  check_convertible(*module, "");
  Replacements replacements;
  convert(*module, "", process_group, replacements);
  return module;
}

SyncBatchNorm convert_sync_batchnorm(const torch::nn::BatchNorm1d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group) {
  return SyncBatchNorm(batch_norm, std::move(process_group));
}

SyncBatchNorm convert_sync_batchnorm(const torch::nn::BatchNorm2d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group) {
  return SyncBatchNorm(batch_norm, std::move(process_group));
}

SyncBatchNorm convert_sync_batchnorm(const torch::nn::BatchNorm3d& batch_norm,
                                     std::shared_ptr<ProcessGroup> process_group) {
  return SyncBatchNorm(batch_norm, std::move(process_group));
}

} // namespace ddp::nn
