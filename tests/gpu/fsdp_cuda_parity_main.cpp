// FullyShardedDataParallel on CUDA against one CPU process: W ranks, each
// holding 1/W of every parameter on its GPU and training on its slice of a
// global batch, must end with the parameters that plain training on the CPU
// gets on the whole batch. Each unit's gather/free cycle runs on CUDA
// tensors: all-gathers into the unit's device buffer before its forward and
// backward, the buffer released after (kFullShard: after the forward too),
// reduce-scatters of the gradients. Cases: the six-unit MLP with every
// strategy and forward prefetch (Adam), the custom module of three FsdpUnits
// and a root parameter (SGD with momentum), bfloat16 mixed precision against
// the same by hand on the CPU, clip_grad_norm, CPU offload (shards,
// gradients and Adam's state in pinned host memory), activation
// checkpointing (ddp::Checkpointed Linears) in float32 and bfloat16.
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/gpu_fsdp_parity_main gloo
//   build/ddprun --nproc-per-node 1 build/tests/gpu_fsdp_parity_main nccl
// prints one line per case on each rank
//   [ok] gpu fsdp parity backend=gloo world=2 device=cuda:0 mlp6 kFullShard: max |ours - reference| 3e-08
// then "gpu_fsdp_parity_main (rank R of W): N of N cases passed"; exits 1
// when a case fails, 77 (a skip for CTest) without a CUDA device or when NCCL
// is asked for with fewer GPUs than ranks on this node.

#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "fsdp/fsdp_models.h"
#include "gpu/gpu_testing.h"

namespace {

using ddp::ShardingStrategy;
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;
using ddp_test::state_difference;

constexpr int kSteps = 6;
constexpr double kTolerance = 1e-5;

torch::Tensor mse(const torch::Tensor& output, const torch::Tensor& target) {
  return (output.to(torch::kFloat) - target).pow(2).mean();
}

struct Case {
  std::string name;
  bool three_unit = false; // else the six-unit MLP
  ddp::FullyShardedDataParallelOptions options;
  bool adam = true; // else SGD with momentum
  double clip = 0;
  bool bf16 = false; // the reference computes in bfloat16 by hand
  double tolerance = kTolerance;
  bool checkpointed = false; // the MLP's Linears each a ddp::Checkpointed
};

// The six-unit MLP `plain` with each Linear a ddp::Checkpointed around it
// (the same modules: state names and values as `plain`'s).
torch::nn::Sequential checkpointed_mlp(torch::nn::SequentialImpl& plain) {
  torch::nn::Sequential wrapped;
  for (size_t i = 0; i < plain.size(); ++i) {
    if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(plain.ptr(i))) {
      wrapped->push_back(ddp::Checkpointed(torch::nn::Linear(linear)));
    } else {
      wrapped->push_back(*(plain.begin() + static_cast<std::ptrdiff_t>(i)));
    }
  }
  return wrapped;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Case& c, std::vector<torch::Tensor> params) {
  if (c.adam) {
    return std::make_unique<torch::optim::Adam>(std::move(params), torch::optim::AdamOptions(1e-2));
  }
  return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
}

std::shared_ptr<torch::nn::Module> make_plain(const Case& c) {
  if (c.three_unit) {
    return ddp_test::ThreeUnitNet().ptr();
  }
  return ddp_test::make_six_unit_mlp().ptr();
}

torch::Tensor call_plain(const Case& c, torch::nn::Module& net, const torch::Tensor& x) {
  if (c.three_unit) {
    return dynamic_cast<ddp_test::ThreeUnitNetImpl&>(net).forward(x);
  }
  return dynamic_cast<torch::nn::SequentialImpl&>(net).forward(x);
}

// The reference: one CPU process on the whole global batch. With bf16, a
// bfloat16 copy computes forward and backward and its gradients step fp32
// master parameters, as FSDP's mixed precision does.
StateDict train_reference(const Case& c) {
  auto master = make_plain(c);
  auto compute = c.bf16 ? make_plain(c) : master;
  if (c.bf16) {
    compute->to(torch::kBFloat16);
  }
  auto optimizer = make_optimizer(c, master->parameters());
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::global_batch(step);
    if (c.bf16) {
      torch::NoGradGuard no_grad;
      auto from = master->parameters();
      auto to = compute->parameters();
      for (size_t i = 0; i < from.size(); ++i) {
        to[i].copy_(from[i]);
      }
    }
    optimizer->zero_grad();
    compute->zero_grad();
    mse(call_plain(c, *compute, c.bf16 ? x.to(torch::kBFloat16) : x), y).backward();
    if (c.bf16) {
      auto from = compute->parameters();
      auto to = master->parameters();
      for (size_t i = 0; i < from.size(); ++i) {
        to[i].mutable_grad() = from[i].grad().to(torch::kFloat);
      }
    }
    if (c.clip > 0) {
      torch::nn::utils::clip_grad_norm_(master->parameters(), c.clip);
    }
    optimizer->step();
  }
  return ddp::full_state_dict_of(*master);
}

// One case: the largest difference to the reference; throws when a shard
// left `device` or a unit kept its full parameters between steps.
double run_case(const Case& c, const torch::Device& device, ddp::ProcessGroup& group) {
  const StateDict expected = train_reference(c);
  auto plain = make_plain(c);
  plain->to(device);
  auto fsdp = c.three_unit
                  ? ddp::FullyShardedDataParallel(
                        ddp_test::ThreeUnitNet(std::dynamic_pointer_cast<ddp_test::ThreeUnitNetImpl>(plain)),
                        c.options)
                  : c.checkpointed
                        ? ddp::FullyShardedDataParallel(
                              checkpointed_mlp(dynamic_cast<torch::nn::SequentialImpl&>(*plain)), c.options)
                        : ddp::FullyShardedDataParallel(
                              torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(plain)),
                              c.options);
  auto optimizer = make_optimizer(c, fsdp->parameters());
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer->zero_grad();
    mse(fsdp(x.to(device)), y.to(device)).backward();
    if (c.clip > 0) {
      fsdp->clip_grad_norm(c.clip);
    }
    optimizer->step();
  }
  if (c.checkpointed) {
    // Every Linear's forward ran checkpointed and was recomputed once in
    // its backward.
    int64_t forwards = 0, recomputations = 0;
    for (const auto& m : fsdp->module()->modules()) {
      if (auto checkpointed = std::dynamic_pointer_cast<ddp::CheckpointedImpl>(m)) {
        forwards += checkpointed->checkpointed_forwards();
        recomputations += checkpointed->recomputations();
      }
    }
    TORCH_CHECK(forwards == 6 * kSteps && recomputations == forwards, "expected ", 6 * kSteps,
                " checkpointed forwards, each recomputed once; counted ", forwards, " forwards and ", recomputations,
                " recomputations");
  }
  // Offloaded: shards, their gradients and the optimizer's state in pinned
  // host memory; else all on the GPU.
  const bool offload = c.options.cpu_offload().offload_params();
  const torch::Device home = offload ? torch::Device(torch::kCPU) : device;
  for (const auto& shard : fsdp->parameters()) {
    TORCH_CHECK(shard.device() == home, "a shard is on ", shard.device(), ", expected ", home);
    TORCH_CHECK(!offload || shard.is_pinned(), "an offloaded shard is not in pinned memory");
    TORCH_CHECK(!shard.grad().defined() || shard.grad().device() == home, "a shard's gradient is on ",
                shard.grad().device(), ", expected ", home);
  }
  if (auto* adam = dynamic_cast<torch::optim::Adam*>(optimizer.get())) {
    for (const auto& item : adam->state()) {
      const auto& state = static_cast<const torch::optim::AdamParamState&>(*item.second);
      TORCH_CHECK(state.exp_avg().device() == home, "Adam's state is on ", state.exp_avg().device(), ", expected ",
                  home);
    }
  }
  // Between steps every unit is sharded (kNoShard keeps its parameters):
  // the module's own parameters point at empty tensors, their gathered
  // buffers released.
  const bool frees = c.options.sharding_strategy() != ShardingStrategy::kNoShard;
  for (const auto& p : fsdp->module()->named_parameters()) {
    TORCH_CHECK(!frees || p.value().numel() == 0, "parameter ", p.key(), " still holds ", p.value().numel(),
                " elements between steps: its unit was not freed");
  }
  return state_difference(fsdp->full_state_dict(ddp::FullStateDictOptions().rank0_only(false)), expected);
}

std::vector<Case> cases() {
  using Options = ddp::FullyShardedDataParallelOptions;
  std::vector<Case> all;
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    all.push_back(Case{std::string("mlp6 ") + ddp::to_string(strategy), false, Options().sharding_strategy(strategy)});
  }
  all.push_back(Case{"mlp6 kFullShard, forward prefetch, no backward prefetch", false,
                     Options().forward_prefetch(true).backward_prefetch(false)});
  all.push_back(Case{"mlp6 kShardGradOp, forward prefetch", false,
                     Options().sharding_strategy(ShardingStrategy::kShardGradOp).forward_prefetch(true)});
  all.push_back(Case{"three-unit kFullShard, SGD", true, Options(), /*adam=*/false});
  all.push_back(Case{"mlp6 kFullShard, clip_grad_norm 0.5", false, Options(), true, /*clip=*/0.5});
  // Shards, gradients and Adam's state in host memory, the step on the CPU.
  all.push_back(Case{"mlp6 kFullShard, cpu_offload, clip_grad_norm 0.5", false,
                     Options().cpu_offload(ddp::CPUOffload().offload_params(true)), true, 0.5});
  // One process sums the gradients in float32 inside the matrix products,
  // W ranks sum W bfloat16 gradients, and the GPU's bfloat16 products
  // accumulate in another order than the CPU's: ~1e-3 after 6 steps.
  all.push_back(Case{"mlp6 kFullShard, bf16 mixed precision", false,
                     Options().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16)), /*adam=*/false, 0,
                     /*bf16=*/true, /*tolerance=*/5e-3});
  // Activation checkpointing: each unit gathered again for its
  // recomputation in backward, in float32 and in bfloat16.
  Case checkpointed{"mlp6 kFullShard, activation checkpointing", false, Options()};
  checkpointed.checkpointed = true;
  all.push_back(checkpointed);
  Case checkpointed_bf16{"mlp6 kFullShard, activation checkpointing, bf16 mixed precision", false,
                         Options().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16)),
                         /*adam=*/false, 0, /*bf16=*/true, /*tolerance=*/5e-3};
  checkpointed_bf16.checkpointed = true;
  all.push_back(checkpointed_bf16);
  return all;
}

int run(const std::string& backend_name) {
  const auto launched = ddp_gpu_test::launch_rank(backend_name);
  if (!launched) {
    return ddp_gpu_test::kSkipExitCode;
  }
  const auto device = launched->device;
  auto& group = *launched->group;
  const auto all = cases();
  int passed = 0;
  for (const auto& c : all) {
    std::string failure;
    double worst = 0.0;
    try {
      torch::cuda::synchronize(device.index());
      worst = run_case(c, device, group);
    } catch (const c10::Error& e) {
      failure = e.what_without_backtrace();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    const bool ok = failure.empty() && worst <= c.tolerance;
    passed += ok ? 1 : 0;
    if (failure.empty()) {
      std::printf("[%s] gpu fsdp parity backend=%s world=%d device=cuda:%d %s: max |ours - reference| %.3g "
                  "(tolerance %.0e)\n",
                  ok ? "ok" : "FAILED", backend_name.c_str(), group.size(), device.index(), c.name.c_str(), worst,
                  c.tolerance);
    } else {
      std::printf("[FAILED] gpu fsdp parity backend=%s world=%d %s: %s\n", backend_name.c_str(), group.size(),
                  c.name.c_str(), failure.c_str());
    }
  }
  std::printf("gpu_fsdp_parity_main (rank %d of %d): %d of %zu cases passed\n", group.rank(), group.size(), passed,
              all.size());
  ddp::destroy_process_group();
  return passed == static_cast<int>(all.size()) ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  return ddp_gpu_test::parity_main(argc, argv, "gpu_fsdp_parity_main", run);
}
