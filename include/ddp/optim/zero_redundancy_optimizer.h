#pragma once

/// ZeroRedundancyOptimizer: PyTorch's `torch.distributed.optim.
/// ZeroRedundancyOptimizer` (ZeRO stage 1) for LibTorch. Every rank keeps
/// all the parameters and gradients, but the optimizer state (Adam's two
/// moments, SGD's momentum) of each parameter lives on one rank only, its
/// owner: per rank about 1/N of a plain optimizer's state.
///
/// `step()` runs a plain LibTorch optimizer over this rank's shard, then
/// every rank's updated parameters are broadcast from their owners, so that
/// all ranks end the step with the same parameters, as with a plain
/// optimizer over all of them. See docs/ddp.md, "Sharded optimizer state".

#include <torch/arg.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp {
class DistributedDataParallel;
} // namespace ddp

namespace ddp::optim {

/// Options of ZeroRedundancyOptimizer.
/// Example:
/// ```
/// ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> opt(
///     model->parameters(), torch::optim::AdamOptions(1e-3),
///     ddp::optim::ZeroRedundancyOptimizerOptions().parameters_as_bucket_view(true));
/// ```
struct ZeroRedundancyOptimizerOptions {
  /// The group the state is sharded over; every member must construct the
  /// optimizer over the same parameters. Default: nullptr, meaning the
  /// default group of `ddp::init_process_group()`.
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  /// Make each rank's parameters views into one flat buffer per owner and
  /// dtype (parameters keep their identity, their storage moves), so that
  /// the broadcast after each step needs no copy in or out. Default: false
  /// (parameters are packed into bounded buckets for the broadcast, or
  /// broadcast in place when larger than a bucket).
  TORCH_ARG(bool, parameters_as_bucket_view) = false;
  /// 1: the optimizer state is sharded (ZeRO stage 1). 2: the gradients
  /// too (ZeRO stage 2): with `overlap_with(model)`, each DDP bucket is
  /// reduce-scattered instead of all-reduced, every rank receiving the
  /// averaged gradients of the parameters it owns, and after the bucket's
  /// step the gradients of the others are freed (left undefined). The
  /// traffic of a step is then that of DDP's allreduce alone. Needs
  /// `overlap_with`. Default: 1.
  TORCH_ARG(int, stage) = 1;
};

/// Which rank owns each parameter: PyTorch's rule, so that a user can
/// predict it. Per parameter group in order, the group's parameters are
/// taken largest first (by element count; equal counts keep their order),
/// each going to the rank whose running total of elements is smallest (the
/// lowest such rank on a tie); the totals carry over from group to group.
/// `numels[g][i]` is the element count of parameter i of group g; the result
/// has the same shape and holds each parameter's owner in [0, world_size).
/// Throws c10::Error when world_size < 1 or a count is negative.
std::vector<std::vector<int>> partition_parameters(const std::vector<std::vector<int64_t>>& numels,
                                                   int world_size);

/// The machinery of ZeroRedundancyOptimizer, independent of the wrapped
/// optimizer's type; use `ZeroRedundancyOptimizer<OptimizerType>`.
///
/// Collectives (call on every rank of the group, in the same order):
/// construction, `step()`, `add_param_group()`, `consolidate_state_dict()`.
/// `zero_grad()`, `save()` and `load()` are local.
///
/// Thread-safety: not thread-safe; use it from one thread, like any
/// LibTorch optimizer.
class ZeroRedundancyOptimizerBase : public torch::optim::Optimizer {
 public:
  /// Makes the wrapped optimizer type over `param_groups`, each of which
  /// carries its options.
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup> param_groups)>;

  ~ZeroRedundancyOptimizerBase() override;

  /// Runs the local optimizer over this rank's shard (evaluating `closure`
  /// once, on every rank, when given), then broadcasts every rank's updated
  /// parameters from their owners. Options changed through `param_groups()`
  /// (a learning-rate scheduler) apply to the shard's step. Returns the
  /// closure's loss, or an undefined tensor. A collective.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Adds a parameter group on every rank and shards it: the owners of the
  /// earlier groups' parameters do not change. A collective; call it here,
  /// not through a `torch::optim::Optimizer&` (whose non-virtual
  /// add_param_group the next `step()` notices and shards the same way).
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  /// Gathers every rank's shard of the optimizer state on rank `to` of the
  /// group, where `save()` then writes it. A collective. The gathered state
  /// is dropped by the next `step()`, `add_param_group()` or `load()`.
  void consolidate_state_dict(int to = 0);

  /// Writes the consolidated state exactly as a plain optimizer of the
  /// wrapped type over all the parameters would (`torch::save(zero, path)`
  /// works; a plain optimizer loads the file). Only on the rank that
  /// `consolidate_state_dict` gathered onto, since it last changed: elsewhere
  /// throws c10::Error saying so.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Reads the state of a plain optimizer of the wrapped type over the same
  /// parameter groups (or of a ZeroRedundancyOptimizer's `save`, on any
  /// number of ranks) and keeps this rank's shard of it. Like a plain
  /// LibTorch optimizer, it restores the per-parameter state only, not the
  /// groups' options. Local: every rank reads the same file.
  void load(torch::serialize::InputArchive& archive) override;

  /// The consolidated state, as a plain optimizer of the wrapped type over
  /// all the parameters (what `save()` writes): only on the rank that
  /// `consolidate_state_dict` gathered onto, since it last changed;
  /// elsewhere throws c10::Error saying so.
  const torch::optim::Optimizer& consolidated() const;

  /// The wrapped optimizer over this rank's shard: one group per group of
  /// this optimizer, holding the parameters this rank owns (possibly none).
  torch::optim::Optimizer& local_optimizer();

  /// The rank (of the group) that owns `parameter`. Throws c10::Error for a
  /// tensor that is not one of the parameters.
  int owner_of(const at::Tensor& parameter) const;

  /// The parameters that rank `rank` owns, group by group, in the order its
  /// local optimizer holds them.
  std::vector<at::Tensor> parameters_of_rank(int rank) const;

  /// The group the state is sharded over.
  const std::shared_ptr<ProcessGroup>& process_group() const;

  /// Overlap with `model`'s backward (PyTorch's `overlap_with_ddp` with
  /// `hook_with_zero_step`): as each of `model`'s gradient buckets is
  /// reduced, this rank steps the parameters it owns in that bucket and the
  /// owners start broadcasting them, while backward goes on; `step()` then
  /// waits for the broadcasts (and steps whatever no bucket covered). Every
  /// iteration updates the parameters, the first ones included, with the
  /// same results as without overlap, on every backend, with any comm hook.
  /// `model` must be built over the same group and hold exactly this
  /// optimizer's parameters. Call on every rank, between iterations, once;
  /// not with ddp::Join. `model` must outlive this optimizer, or call
  /// nothing on it after the optimizer is destroyed.
  void overlap_with(DistributedDataParallel& model);

 protected:
  ZeroRedundancyOptimizerBase(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                              std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                              Factory factory, const ZeroRedundancyOptimizerOptions& options);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// ZeroRedundancyOptimizer over any LibTorch optimizer type that is built
/// from `(std::vector<OptimizerParamGroup>, Options)`: SGD, Adam, AdamW,
/// Adagrad, RMSprop, or one of your own. A `torch::optim::Optimizer`, so
/// that a training loop written against `torch::optim::Optimizer&` runs
/// unchanged.
/// Example:
/// ```
/// ddp::optim::ZeroRedundancyOptimizer<torch::optim::Adam> opt(
///     model->parameters(), torch::optim::AdamOptions(1e-3));
/// ```
template <typename OptimizerType>
class ZeroRedundancyOptimizer : public ZeroRedundancyOptimizerBase {
  static_assert(std::is_base_of_v<torch::optim::Optimizer, OptimizerType>,
                "ZeroRedundancyOptimizer wraps a torch::optim::Optimizer");
  // LBFGS evaluates its closure a number of times that depends on its own
  // shard: under DistributedDataParallel, ranks would run different numbers
  // of backward passes and wait for each other for ever.
  static_assert(!std::is_same_v<OptimizerType, torch::optim::LBFGS>,
                "ZeroRedundancyOptimizer cannot wrap LBFGS: it evaluates its closure a number "
                "of times that differs between shards");

 public:
  /// Shards `parameters` (one group with `defaults`). A collective.
  template <typename Options>
  ZeroRedundancyOptimizer(std::vector<at::Tensor> parameters, const Options& defaults,
                          const ZeroRedundancyOptimizerOptions& options = {})
      : ZeroRedundancyOptimizer(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup(std::move(parameters))},
            defaults, options) {}

  /// Shards `param_groups`; a group without options takes `defaults`. A
  /// collective.
  template <typename Options>
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          const Options& defaults,
                          const ZeroRedundancyOptimizerOptions& options = {})
      : ZeroRedundancyOptimizerBase(
            std::move(param_groups), std::make_unique<Options>(defaults),
            [defaults](std::vector<torch::optim::OptimizerParamGroup> groups) {
              return std::unique_ptr<torch::optim::Optimizer>(
                  std::make_unique<OptimizerType>(std::move(groups), defaults));
            },
            options) {}

  /// The wrapped optimizer over this rank's shard, as its own type.
  OptimizerType& local() {
    return static_cast<OptimizerType&>(local_optimizer());
  }
};

} // namespace ddp::optim
