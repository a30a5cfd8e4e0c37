// The collectives that ddp issues for its callers carry a label, which a
// mismatch error shows beside the sequence numbers (and the flight recorder
// records): run under ddprun with 2 ranks, each case a launch of its own
// (a mismatch leaves the group unusable), where the two ranks call
// different library collectives at the same point:
//   syncbn-vs-ddp   rank 0 samples through the unwrapped model, whose
//                   SyncBatchNorm (converted, named "1") is in training
//                   mode; rank 1 runs the DDP model, which first broadcasts
//                   its buffers
//   zero-vs-fsdp    rank 0 steps a ZeroRedundancyOptimizer; rank 1 runs an
//                   FSDP model's forward
// Each rank prints "labels_main: caught: <the error>" and exits 3.

#include <torch/torch.h>

#include <cstdio>
#include <string>

#include <ddp/ddp.h>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group(
        ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::seconds(60)));
    const int rank = group->rank();
    torch::manual_seed(0);
    if (mode == "syncbn-vs-ddp") {
      torch::nn::Sequential net(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6));
      ddp::nn::convert_sync_batchnorm(net);
      ddp::DistributedDataParallel model(net);
      auto x = torch::randn({8, 4});
      for (int step = 0; step < 2; ++step) { // after two steps the buckets are rebuilt, and the next
        model(x).sum().backward();           // forward broadcasts the buffers first
      }
      if (rank == 0) {
        net->forward(x); // SyncBatchNorm '1' forward, alone
      } else {
        model(x); // DDP buffer broadcast first
      }
    } else if (mode == "zero-vs-fsdp") {
      torch::nn::Sequential mlp(torch::nn::Linear(4, 6), torch::nn::Linear(6, 2));
      torch::nn::Sequential other(torch::nn::Linear(4, 6), torch::nn::Linear(6, 2));
      ddp::optim::ZeroRedundancyOptimizer<torch::optim::SGD> zero(mlp->parameters(), torch::optim::SGDOptions(0.1));
      ddp::FullyShardedDataParallel fsdp(other);
      mlp->forward(torch::randn({3, 4})).sum().backward();
      if (rank == 0) {
        zero.step(); // ZeRO step: broadcasts from the owners
      } else {
        fsdp(torch::randn({3, 4})); // FSDP unit 0 all-gather
      }
    } else {
      std::fprintf(stderr, "labels_main: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    std::printf("labels_main: no error\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("labels_main: caught: %s\n", ddp::error_message(e).c_str());
    std::fflush(stdout);
    std::_Exit(3); // the group is broken: no orderly teardown
  }
}
