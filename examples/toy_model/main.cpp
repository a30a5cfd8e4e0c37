// PyTorch's "Getting Started with Distributed Data Parallel" tutorial, step
// for step in C++: set-up and clean-up, a toy model wrapped in
// DistributedDataParallel, one training step, and the checkpoint demo (rank 0
// saves, everyone waits, every rank loads onto its own device).
//
// Usage:
//   build/ddprun --nproc-per-node 2 build/examples/toy_model [--backend auto|gloo|nccl]
// prints, for each rank R of the 2 (the ranks' lines interleave in any order;
// the losses differ from rank to rank):
//   [rank R]: toy_model: rank R of 2 (local rank R of 2) on cpu, backend gloo, BLAS OpenBLAS, 1 thread
//   [rank R]: basic: loss 1.4909 (each rank has its own random batch)
//   [rank R]: basic: gradients agree across 2 ranks (max difference 0)
//   [rank R]: basic: parameters agree across 2 ranks (max difference 0)
//   [rank 0]: evaluation on rank 0 only, through the inner module: loss 1.2667
//   [rank R]: checkpoint: loaded /tmp/ddp_toy_model.28854.pt, loss 1.1552
//   [rank R]: checkpoint: parameters agree across 2 ranks (max difference 0)
// Run with no launcher,
//   build/examples/toy_model
// it is a world of size 1 and prints the same lines for rank 0 of 1. The
// device is cuda:<LOCAL_RANK> when CUDA is available, else the CPU. Exit
// status: 0 when all checks pass, 1 if the ranks' gradients or parameters
// differ (the line says DIFFER) or on an error, 2 on a bad argument or
// environment (e.g. LOCAL_RANK names a GPU that does not exist).

#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace {

// "OpenBLAS, 1 thread": what the header line says of the BLAS, so that a
// slow run on the reference BLAS, or on more BLAS threads than cores, shows.
std::string blas_summary() {
  const int threads = ddp::blas_num_threads();
  return ddp::blas_in_use().name +
      (threads > 0 ? ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") : "");
}

// ---- The model ---------------------------------------------------------------
// The tutorial's ToyModel: net1 -> relu -> net2.
struct ToyModelImpl : torch::nn::Module {
  ToyModelImpl()
      : net1(register_module("net1", torch::nn::Linear(10, 10))),
        relu(register_module("relu", torch::nn::ReLU())),
        net2(register_module("net2", torch::nn::Linear(10, 5))) {}

  torch::Tensor forward(torch::Tensor x) {
    return net2(relu(net1(x)));
  }

  torch::nn::Linear net1;
  torch::nn::ReLU relu;
  torch::nn::Linear net2;
};
TORCH_MODULE(ToyModel);

// ---- Set-up and clean-up -------------------------------------------------------

// A usage error: reported as such and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

ddp::Backend parse_backend(int argc, char** argv) {
  ddp::Backend backend = ddp::Backend::kAuto;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    if (arg == "--backend" && i + 1 < argc) {
      value = argv[++i];
    } else if (arg.rfind("--backend=", 0) == 0) {
      value = arg.substr(std::strlen("--backend="));
    } else {
      throw UsageError("unknown argument '" + arg +
                       "'\nusage: toy_model [--backend auto|gloo|nccl]");
    }
    if (value == "auto") {
      backend = ddp::Backend::kAuto;
    } else if (value == "gloo") {
      backend = ddp::Backend::kGloo;
    } else if (value == "nccl") {
      backend = ddp::Backend::kNccl;
    } else {
      throw UsageError("--backend must be auto, gloo or nccl (got '" + value + "')");
    }
  }
  return backend;
}

// The tutorial's device choice, "cuda:<rank>" if CUDA is available else
// "cpu", with the local rank: on several nodes the global rank can exceed
// the GPUs of one node.
torch::Device pick_device(const ddp::WorldInfo& world) {
  if (!torch::cuda::is_available()) {
    std::printf("CUDA is not available (no GPU, or a CPU-only LibTorch): training on the CPU\n");
    return torch::kCPU;
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (world.local_rank >= gpus) {
    throw UsageError("LOCAL_RANK is " + std::to_string(world.local_rank) + " but this node has " +
                     std::to_string(gpus) + " visible CUDA device(s): start at most " +
                     std::to_string(gpus) + " ranks per node (--nproc-per-node)");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
}

// The tutorial's setup(): here the launcher (ddprun, torchrun, srun) has put
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment. With none
// of them, the group is a world of size 1, so the same program runs on a
// machine with one GPU, or none, without a special case.
std::shared_ptr<ddp::ProcessGroup> setup(ddp::Backend backend) {
  return ddp::init_process_group(ddp::InitOptions().backend(backend));
}

// The tutorial's cleanup().
void cleanup() {
  ddp::destroy_process_group();
}

// ---- Debugging aids ------------------------------------------------------------

// The largest absolute difference between this rank's gradients and rank 0's,
// the same on every rank. A collective: every rank calls it. After a backward
// through DDP every rank holds the same averaged gradients; a difference
// means gradients were not synchronised. (For parameters, DDP has
// max_parameter_difference_across_ranks().)
double max_gradient_difference_across_ranks(ddp::ProcessGroup& group,
                                            const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : parameters) {
    if (p.grad().defined()) {
      flat.push_back(p.grad().detach().reshape({-1}).to(torch::kDouble));
    }
  }
  if (flat.empty()) {
    return 0.0;
  }
  auto mine = torch::cat(flat);
  auto reference = mine.clone();
  group.broadcast(reference)->wait(); // root 0
  auto difference = (mine - reference).abs().max().reshape({1});
  group.allreduce(difference, {ddp::ReduceOp::kMax})->wait();
  return difference.item<double>();
}

// Prints the agreement line, or says what is wrong and returns false. DDP
// promises identical parameters, not merely close ones: every rank applies
// the same averaged gradient to the same values.
bool report_agreement(const char* stage, const char* what, double difference, int world) {
  const char* ranks = world == 1 ? "rank" : "ranks";
  if (difference == 0.0) {
    std::printf("%s: %s agree across %d %s (max difference 0)\n", stage, what, world, ranks);
    return true;
  }
  std::printf("%s: %s DIFFER across %d %s (max difference %g): gradients were not "
              "synchronised\n",
              stage, what, world, ranks, difference);
  return false;
}

// ---- The two demos ---------------------------------------------------------------

// The tutorial's demo_basic: one step of SGD on a random batch.
bool demo_basic(ddp::ProcessGroup& group, torch::Device device) {
  // Move the model to its device before wrapping it. The constructor is a
  // synchronisation point: it broadcasts rank 0's parameters, so the ranks'
  // different random initialisations do not matter.
  ToyModel model;
  model->to(device);
  auto options = ddp::DistributedDataParallelOptions();
  if (device.is_cuda()) {
    options.device_ids({device}); // as PyTorch: device_ids=[rank] for a GPU, none for CPU
  }
  ddp::DistributedDataParallel ddp_model(model, options);

  torch::nn::MSELoss loss_fn;
  torch::optim::SGD optimizer(ddp_model->parameters(), torch::optim::SGDOptions(0.001));

  optimizer.zero_grad();
  // Forward and backward are synchronisation points too: backward averages
  // the gradients over the ranks while it runs.
  auto outputs = ddp_model(torch::randn({20, 10}).to(device));
  auto labels = torch::randn({20, 5}).to(device);
  auto loss = loss_fn(outputs, labels);
  loss.backward();
  std::printf("basic: loss %.4f (each rank has its own random batch)\n", loss.item<double>());
  bool ok = report_agreement("basic", "gradients",
                             max_gradient_difference_across_ranks(group, ddp_model->parameters()),
                             group.size());
  optimizer.step();
  ok = report_agreement("basic", "parameters", ddp_model->max_parameter_difference_across_ranks(),
                        group.size()) &&
       ok;

  // Evaluation on one rank only must not go through the wrapper: its forward
  // is a collective and would wait for ranks that never call it. The inner
  // module is the plain ToyModel, with the trained parameters.
  if (group.rank() == 0) {
    torch::NoGradGuard no_grad;
    auto inner = ddp_model->module_as<ToyModelImpl>();
    auto x = torch::randn({20, 10}).to(device);
    auto y = torch::randn({20, 5}).to(device);
    std::printf("evaluation on rank 0 only, through the inner module: loss %.4f\n",
                loss_fn(inner->forward(x), y).item<double>());
  }
  group.barrier()->wait(); // the others wait here until rank 0 is done
  return ok;
}

// The tutorial's demo_checkpoint: rank 0 saves, every rank loads the file onto
// its own device and trains one more step.
bool demo_checkpoint(ddp::ProcessGroup& group, torch::Device device) {
  ToyModel model;
  model->to(device);
  auto options = ddp::DistributedDataParallelOptions();
  if (device.is_cuda()) {
    options.device_ids({device});
  }
  ddp::DistributedDataParallel ddp_model(model, options);

  // Every rank must name the same file, and two jobs on one machine must not
  // share it: rank 0's process id names it, broadcast to the others. (The
  // directory must be one that every rank can read: on several nodes, a
  // shared file system rather than /tmp.)
  auto job_id = torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong).to(device);
  group.broadcast(job_id)->wait();
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string path = std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") +
                           "/ddp_toy_model." + std::to_string(job_id.item<int64_t>()) + ".pt";

  // All ranks hold the same parameters (the constructor broadcast them), so
  // saving on one rank is enough: rank 0 writes, then every rank waits at a
  // barrier inside save_checkpoint, the tutorial's dist.barrier(), so that
  // nobody reads a file that is not complete. save_checkpoint writes the
  // parameters from wherever they live; there is no need to move the model
  // to the CPU first (which in PyTorch would take it out of DDP's hands).
  ddp::save_checkpoint(ddp_model, path);

  // Every rank loads onto the device its parameters live on: the tutorial's
  // map_location={"cuda:0": "cuda:<rank>"}.
  ddp::load_checkpoint(ddp_model, path);

  torch::nn::MSELoss loss_fn;
  torch::optim::SGD optimizer(ddp_model->parameters(), torch::optim::SGDOptions(0.001));
  optimizer.zero_grad();
  auto outputs = ddp_model(torch::randn({20, 10}).to(device));
  auto labels = torch::randn({20, 5}).to(device);
  auto loss = loss_fn(outputs, labels);
  loss.backward();
  optimizer.step();
  std::printf("checkpoint: loaded %s, loss %.4f\n", path.c_str(), loss.item<double>());

  // No barrier is needed before removing the file: every rank loaded it
  // before its backward, and backward's allreduce completes on rank 0 only
  // once every rank has joined it.
  if (group.rank() == 0) {
    std::remove(path.c_str());
  }
  return report_agreement("checkpoint", "parameters",
                          ddp_model->max_parameter_difference_across_ranks(), group.size());
}

} // namespace

int main(int argc, char** argv) {
  // ddprun passes stdout through a pipe: print each line as it is written.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    const ddp::Backend backend = parse_backend(argc, argv);
    ddp::WorldInfo world;
    try {
      world = ddp::world_info_from_env();
    } catch (const c10::Error& e) {
      throw UsageError(ddp::error_message(e)); // a malformed RANK, WORLD_SIZE, ...
    }
    const torch::Device device = pick_device(world);

    auto group = setup(backend);
    // Different seeds: different random batches on each rank, as the
    // tutorial's processes have, and different initial parameters, which
    // DDP's constructor makes equal.
    torch::manual_seed(static_cast<uint64_t>(group->rank()));
    std::printf("toy_model: rank %d of %d (local rank %d of %d) on %s, backend %s, BLAS %s\n", group->rank(),
                group->size(), world.local_rank, world.local_world_size, device.str().c_str(),
                group->backend_name().c_str(), blas_summary().c_str());

    bool ok = demo_basic(*group, device);
    ok = demo_checkpoint(*group, device) && ok;
    cleanup();
    return ok ? 0 : 1;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "toy_model: %s\n", ddp::error_message(e).c_str());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "toy_model: %s\n", ddp::error_message(e).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "toy_model: %s\n", ddp::error_message(e).c_str());
    return 1;
  }
}
