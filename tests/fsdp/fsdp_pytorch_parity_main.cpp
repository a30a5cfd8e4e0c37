// ddp's half of the parity test with PyTorch's FSDP under bfloat16 mixed
// precision (tests/fsdp/pytorch_fsdp_parity.sh; PyTorch's half is
// pytorch_fsdp_reference.py, which describes the training both run).
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/tests/fsdp_pytorch_parity_main OUT full|grad-op
// Rank 0 writes the full state after training to OUT ("name v0 v1 ...",
// %.9g, as the Python side) and prints "wrote OUT". Exits 1 on an error.

#include <torch/torch.h>

#include <cstdio>
#include <string>

#include <ddp/ddp.h>

#include "fsdp/fsdp_models.h"
#include "nn/closed_form.h"

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[2]) != "full" && std::string(argv[2]) != "grad-op")) {
    std::fprintf(stderr, "usage: fsdp_pytorch_parity_main OUT full|grad-op\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    ddp::FullyShardedDataParallel model(
        ddp_test::make_six_unit_mlp(),
        ddp::FullyShardedDataParallelOptions()
            .sharding_strategy(std::string(argv[2]) == "full" ? ddp::ShardingStrategy::kFullShard
                                                             : ddp::ShardingStrategy::kShardGradOp)
            .mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16).reduce_dtype(torch::kBFloat16)));
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 10; ++step) {
      auto [x, y] = ddp_test::rank_batch(step, group->rank(), group->size());
      optimizer.zero_grad();
      (model(x).to(torch::kFloat) - y).pow(2).mean().backward();
      optimizer.step();
    }
    const auto state = model->full_state_dict();
    if (group->rank() == 0) {
      auto plain = ddp_test::make_six_unit_mlp();
      ddp::load_full_state_dict(*plain, state);
      if (!ddp_test::write_state_text(*plain, argv[1])) {
        throw std::runtime_error(std::string("cannot write ") + argv[1]);
      }
      std::printf("wrote %s\n", argv[1]);
    }
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_pytorch_parity_main: %s\n", e.what());
    return 1;
  }
}
