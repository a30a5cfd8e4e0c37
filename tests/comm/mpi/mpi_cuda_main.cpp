// The MPI backend with CUDA tensors, for a machine with a GPU (not a CTest
// test: the CPU machines that run the suite have none).
//
// Usage:
//   DDP_BACKEND=mpi mpirun -np 2 build-cuda/tests/mpi_cuda_main
// Every rank drives cuda:(local rank modulo the device count), so 2 ranks
// may share one GPU. It prints, on each rank,
//   mpi_cuda_main: [rank 0] 8 checks passed on cuda:0
// and exits 0, or names the failed checks and exits 1 (2 without a GPU).
//
// What it checks: every kind of collective and send/recv on CUDA tensors,
// which the backend stages through pinned host memory (host_staging.h); that
// a collective sees work queued on the caller's stream just before it (the
// stream fence); and a DistributedDataParallel step on the GPU, whose
// gradients must agree across ranks.

#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace {

int failures = 0;
int passed = 0;

void expect(bool ok, int rank, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failures;
    std::printf("mpi_cuda_main: [rank %d] FAILED: %s\n", rank, what.c_str());
  }
}

} // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!torch::cuda::is_available()) {
    std::printf("mpi_cuda_main: no CUDA device; run it on a machine with a GPU\n");
    return 2;
  }
  try {
    const auto world = ddp::world_info_from_env();
    const auto pg = ddp::init_process_group();
    const int rank = pg->rank();
    const int w = pg->size();
    const torch::Device device(torch::kCUDA,
                               static_cast<c10::DeviceIndex>(world.local_rank % torch::cuda::device_count()));
    const auto on = torch::TensorOptions().device(device);

    // allreduce, Float and Half, after a kernel queued on the caller's
    // stream: the fence orders the staging copy after it.
    for (auto dtype : {torch::kFloat, torch::kHalf}) {
      auto t = torch::full({1 << 20}, rank + 1.0, on.dtype(dtype));
      t.mul_(2);
      pg->allreduce(t)->wait();
      expect(torch::equal(t.cpu(), torch::full({1 << 20}, 1.0 * w * (w + 1), torch::TensorOptions().dtype(dtype))),
             rank, std::string("allreduce of ") + c10::toString(dtype));
    }
    // broadcast from the last rank.
    auto b = torch::full({1000}, 10.0 * rank, on);
    pg->broadcast(b, {w - 1})->wait();
    expect(torch::equal(b.cpu(), torch::full({1000}, 10.0 * (w - 1))), rank, "broadcast");
    // allgather_into_tensor and reduce_scatter.
    auto gathered = torch::empty({w * 3}, on);
    pg->allgather_into_tensor(gathered, torch::full({3}, 1.0 * rank, on))->wait();
    expect(torch::equal(gathered.cpu(), torch::arange(w).repeat_interleave(3).to(torch::kFloat)), rank,
           "allgather_into_tensor");
    std::vector<torch::Tensor> pieces;
    for (int r = 0; r < w; ++r) {
      pieces.push_back(torch::full({5}, 1.0 * (r + 1), on));
    }
    auto mine = torch::empty({5}, on);
    pg->reduce_scatter(mine, pieces)->wait();
    expect(torch::equal(mine.cpu(), torch::full({5}, 1.0 * w * (rank + 1))), rank, "reduce_scatter");
    // alltoall: chunk c of rank r holds 10r + c.
    auto input = (torch::arange(w) + 10 * rank).to(on.dtype(torch::kLong));
    auto output = torch::empty({w}, on.dtype(torch::kLong));
    pg->alltoall(output, input)->wait();
    expect(torch::equal(output.cpu(), torch::arange(w) * 10 + rank), rank, "alltoall");
    // send/recv around the ring.
    if (w > 1) {
      auto out = torch::full({7}, 1.0 * rank, on);
      auto in = torch::empty({7}, on);
      auto sent = pg->send(out, (rank + 1) % w, {3});
      auto received = pg->recv(in, (rank + w - 1) % w, {3});
      sent->wait();
      received->wait();
      expect(torch::equal(in.cpu(), torch::full({7}, 1.0 * ((rank + w - 1) % w))), rank, "send/recv");
    }
    // A DDP step on the GPU: the gradients agree across ranks.
    torch::manual_seed(rank); // different weights, which DDP's constructor makes equal
    auto net = torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
    net->to(device);
    ddp::DistributedDataParallel model(net);
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    optimizer.zero_grad();
    torch::mse_loss(model(torch::randn({8, 16}, on)), torch::randn({8, 4}, on)).backward();
    optimizer.step();
    expect(model->max_parameter_difference_across_ranks() == 0, rank,
           "DDP step: parameters differ across ranks");
    std::printf("mpi_cuda_main: [rank %d] %d checks passed on %s%s\n", rank, passed,
                device.str().c_str(), failures ? ", some FAILED" : "");
    ddp::destroy_process_group();
    return failures ? 1 : 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "mpi_cuda_main: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_cuda_main: %s\n", e.what());
  }
  return 1;
}
