// Trains interop_model.h's model under DDP, ZeroRedundancyOptimizer or
// FullyShardedDataParallel (or alone), loading and saving checkpoints in
// PyTorch's formats; the shell tests run it beside interop.py, its Python
// twin, and compare what each side ends with.
//
// Usage (under ddprun for more than one rank):
//   checkpoint_interop_main --parallel ddp|zero|fsdp|plain --optim adam|adamw|sgd|rmsprop|adagrad
//       [--load-torch DIR | --load-dcp DIR] [--first-step S] [--steps N]
//       [--save-torch DIR] [--save-dcp DIR] [--save-safetensors FILE]
//       [--then-steps M --final FILE] [--device cpu|cuda] [--backend gloo|nccl|auto]
//       [--expect-torch DIR]
// --expect-torch DIR: after loading, the full model and optimizer states
// must equal DIR/model.pt and DIR/optim.pt bit for bit (else exit 1).
// Starts from the closed-form weights (or the checkpoint), trains N steps
// on batches S, S+1, ..., saves what is asked, trains M steps more and
// writes the full model state to FILE (torch.save format, rank 0).
// --load-torch reads DIR/model.pt and DIR/optim.pt; --save-torch writes
// them. With --device cuda the model trains on cuda:LOCAL_RANK, with
// cuda:0 on that GPU whatever the rank (with Gloo, which stages CUDA
// tensors through the host, 2 ranks can share one GPU). Prints
// "checkpoint_interop_main: done" at the end.

#include <torch/torch.h>

#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <string>

#include <ddp/checkpoint/dcp.h>
#include <ddp/checkpoint/safetensors.h>
#include <ddp/checkpoint/torch_format.h>
#include <ddp/ddp.h>

#include "checkpoint/interop_model.h"

namespace {

using ddp_test::interop::batch;

struct Args {
  std::string parallel = "ddp";
  std::string optim = "adam";
  std::string device = "cpu";
  std::string backend = "gloo";
  std::string load_torch, load_dcp, save_torch, save_dcp, save_safetensors, final_file, expect_torch;
  int first_step = 0;
  int steps = 0;
  int then_steps = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string*> strings = {
      {"--parallel", &a.parallel},     {"--optim", &a.optim}, {"--device", &a.device}, {"--backend", &a.backend},         {"--load-torch", &a.load_torch},
      {"--load-dcp", &a.load_dcp},     {"--save-torch", &a.save_torch}, {"--save-dcp", &a.save_dcp},
      {"--save-safetensors", &a.save_safetensors}, {"--final", &a.final_file},
      {"--expect-torch", &a.expect_torch}};
  std::map<std::string, int*> ints = {{"--first-step", &a.first_step}, {"--steps", &a.steps}, {"--then-steps", &a.then_steps}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (strings.count(flag)) {
      *strings[flag] = argv[i + 1];
    } else if (ints.count(flag)) {
      *ints[flag] = std::stoi(argv[i + 1]);
    } else {
      throw std::runtime_error("unknown flag " + flag);
    }
  }
  return a;
}

// An optimizer state dict by parameter name: `names` name the indices
// where the state dict has no names of its own.
std::map<std::string, torch::OrderedDict<std::string, at::Tensor>> by_name(const ddp::OptimizerStateDict& state,
                                                                           const std::vector<std::string>& names) {
  std::map<std::string, torch::OrderedDict<std::string, at::Tensor>> out;
  for (const auto& [index, tensors] : state.state) {
    const auto& own = state.param_names;
    out[own.empty() ? names.at(static_cast<size_t>(index)) : own.at(static_cast<size_t>(index))] = tensors;
  }
  return out;
}

// Empty when `a` and `b` hold the same tensors bit for bit; else what differs.
std::string difference(const ddp::StateDict& a, const ddp::StateDict& b, const std::string& what) {
  if (a.size() != b.size()) {
    return c10::str(what, ": ", a.size(), " tensors against ", b.size());
  }
  for (const auto& item : a) {
    const at::Tensor* other = b.find(item.key());
    if (other == nullptr) {
      return what + ": " + item.key() + " is missing from the reference";
    }
    const auto x = item.value().cpu();
    const auto y = other->cpu();
    if (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes() || !at::equal(x, y)) {
      return what + ": " + item.key() + " differs";
    }
  }
  return "";
}

} // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    const Args args = parse(argc, argv);
    const bool plain = args.parallel == "plain";
    std::shared_ptr<ddp::ProcessGroup> group;
    if (!plain) {
      const auto backend = args.backend == "nccl" ? ddp::Backend::kNccl
                           : args.backend == "auto" ? ddp::Backend::kAuto
                                                    : ddp::Backend::kGloo;
      group = ddp::init_process_group(ddp::InitOptions().backend(backend));
    }
    const int rank = group ? group->rank() : 0;
    const int world = group ? group->size() : 1;
    // "cuda": this rank's GPU, cuda:LOCAL_RANK; "cuda:0": that one for every rank.
    const torch::Device device = args.device == "cuda"
        ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ddp::world_info_from_env().local_rank))
        : torch::Device(args.device);

    auto net = ddp_test::interop::make_model();
    net->to(device);
    std::optional<ddp::DistributedDataParallel> ddp_model;
    std::optional<ddp::FullyShardedDataParallel> fsdp_model;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (args.parallel == "fsdp") {
      fsdp_model.emplace(net);
      optimizer = ddp_test::interop::make_optimizer(args.optim, (*fsdp_model)->parameters());
    } else {
      if (!plain) {
        ddp_model.emplace(net);
      }
      if (args.parallel == "zero") {
        auto params = net->parameters();
        using namespace torch::optim;
        using ddp::optim::ZeroRedundancyOptimizer;
        if (args.optim == "adam") {
          optimizer = std::make_unique<ZeroRedundancyOptimizer<Adam>>(params, AdamOptions(0.01).weight_decay(0.001));
        } else if (args.optim == "sgd") {
          optimizer = std::make_unique<ZeroRedundancyOptimizer<SGD>>(params, SGDOptions(0.05).momentum(0.9).nesterov(true));
        } else {
          throw std::runtime_error("zero: adam or sgd");
        }
      } else {
        optimizer = ddp_test::interop::make_optimizer(args.optim, net->parameters());
      }
    }
    auto forward = [&](const at::Tensor& x) {
      return fsdp_model ? (*fsdp_model)(x) : ddp_model ? (*ddp_model)(x) : net->forward(x);
    };

    if (!args.load_torch.empty()) {
      const std::string model_path = args.load_torch + "/model.pt";
      const std::string optim_path = args.load_torch + "/optim.pt";
      if (fsdp_model) {
        ddp::load_torch_checkpoint(*fsdp_model, optimizer.get(), model_path, optim_path);
      } else if (ddp_model) {
        ddp::load_torch_checkpoint(*ddp_model, optimizer.get(), model_path, optim_path);
      } else {
        ddp::load_module_state_dict(*net, ddp::load_torch_state_dict(model_path));
        ddp::load_optimizer_state_dict(*optimizer, ddp::load_torch_optimizer_state_dict(optim_path));
      }
    } else if (!args.load_dcp.empty()) {
      if (fsdp_model) {
        ddp::dcp::load(*fsdp_model, *optimizer, args.load_dcp);
      } else if (ddp_model) {
        ddp::dcp::load(*ddp_model, *optimizer, args.load_dcp);
      } else {
        ddp::dcp::load(*net, optimizer.get(), args.load_dcp);
      }
    }

    if (!args.expect_torch.empty()) {
      // The full states, gathered (collectives), compared on rank 0.
      const auto model_state = fsdp_model ? (*fsdp_model)->full_state_dict() : ddp::module_state_dict(*net);
      ddp::OptimizerStateDict optimizer_state;
      if (fsdp_model) {
        optimizer_state = ddp::full_optimizer_state_dict(*fsdp_model, *optimizer);
      } else {
        if (auto* zero = dynamic_cast<ddp::optim::ZeroRedundancyOptimizerBase*>(optimizer.get())) {
          zero->consolidate_state_dict(0);
        }
        if (rank == 0) {
          optimizer_state = ddp::optimizer_state_dict(*optimizer);
        }
      }
      if (rank == 0) {
        std::vector<std::string> names;
        for (const auto& item : net->named_parameters()) {
          names.push_back(item.key());
        }
        std::string problem = difference(model_state, ddp::load_torch_state_dict(args.expect_torch + "/model.pt"), "model");
        const auto mine = by_name(optimizer_state, names);
        const auto theirs = by_name(ddp::load_torch_optimizer_state_dict(args.expect_torch + "/optim.pt"), names);
        if (problem.empty() && mine.size() != theirs.size()) {
          problem = c10::str("optimizer: states of ", mine.size(), " parameters against ", theirs.size());
        }
        for (const auto& [name, tensors] : mine) {
          if (problem.empty()) {
            problem = theirs.count(name) ? difference(tensors, theirs.at(name), "optimizer state of " + name)
                                         : "optimizer state of " + name + " is not in the reference";
          }
        }
        if (!problem.empty()) {
          throw std::runtime_error("the loaded state is not " + args.expect_torch + "'s: " + problem);
        }
        std::printf("checkpoint_interop_main: loaded state equals %s bit for bit\n", args.expect_torch.c_str());
      }
    }

    int step = args.first_step;
    auto train = [&](int n) {
      for (int i = 0; i < n; ++i, ++step) {
        auto [x, y] = batch(step, rank, world);
        optimizer->zero_grad();
        torch::mse_loss(forward(x.to(device)), y.to(device)).backward();
        optimizer->step();
      }
    };
    train(args.steps);

    if (!args.save_torch.empty()) {
      if (rank == 0) {
        ::mkdir(args.save_torch.c_str(), 0777);
      }
      const std::string model_path = args.save_torch + "/model.pt";
      const std::string optim_path = args.save_torch + "/optim.pt";
      if (fsdp_model) {
        ddp::save_torch_checkpoint(*fsdp_model, optimizer.get(), model_path, optim_path);
      } else if (ddp_model) {
        ddp::save_torch_checkpoint(*ddp_model, optimizer.get(), model_path, optim_path);
      } else {
        ddp::save_torch_state_dict(ddp::module_state_dict(*net), model_path);
        ddp::save_torch_optimizer_state_dict(ddp::optimizer_state_dict(*optimizer), optim_path);
      }
    }
    if (!args.save_dcp.empty()) {
      if (fsdp_model) {
        ddp::dcp::save(*fsdp_model, *optimizer, args.save_dcp);
      } else if (ddp_model) {
        ddp::dcp::save(*ddp_model, *optimizer, args.save_dcp);
      } else {
        ddp::dcp::save(*net, optimizer.get(), args.save_dcp);
      }
    }
    auto full_state = [&] {
      return fsdp_model ? (*fsdp_model)->full_state_dict() : ddp::module_state_dict(*net);
    };
    if (!args.save_safetensors.empty()) {
      const auto state = full_state(); // a collective under FSDP
      if (rank == 0) {
        ddp::save_safetensors(state, args.save_safetensors);
      }
    }
    train(args.then_steps);
    if (!args.final_file.empty()) {
      const auto state = full_state();
      if (rank == 0) {
        ddp::save_torch_state_dict(state, args.final_file);
      }
    }
    if (group) {
      group->barrier()->wait();
      ddp::destroy_process_group();
    }
    std::printf("checkpoint_interop_main: done\n");
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "checkpoint_interop_main: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_interop_main: %s\n", e.what());
    return 1;
  }
}
