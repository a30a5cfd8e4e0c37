// Sharded checkpoints of FullyShardedDataParallel, one step of a scenario
// per launch (tests/fsdp/sharded_checkpoint_cases.sh runs them): the
// three-unit model of fsdp_models.h under kFullShard with Adam, each rank
// training on its slice of the closed-form batches.
//
// Usage (under ddprun, or alone for `full`):
//   fsdp_checkpoint_main save <path> <steps>     train steps [0, steps), save
//   fsdp_checkpoint_main resume <path> <steps>   load (with the optimizer),
//                                                train `steps` more
//   fsdp_checkpoint_main load-full <path>        load through a full state
//                                                (any world size)
//   fsdp_checkpoint_main full <path>             one process, no group: the
//                                                checkpoint's full state
// Each prints, on rank 0, "digest <value>": a number of the full state
// (every parameter and buffer, element i weighted by i + 1, summed in
// double), equal for equal states; `resume` starts at the saved step, read
// from <path>.step. Exits 1 on an error, 2 on a bad command line.

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <ddp/ddp.h>

#include "fsdp/fsdp_models.h"
#include "nn/closed_form.h"

namespace {

using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

double digest(const StateDict& state) {
  double sum = 0;
  for (const auto& item : state) {
    auto flat = item.value().detach().to(torch::kDouble).reshape({-1});
    sum += (flat * torch::arange(1, flat.numel() + 1, torch::kDouble)).sum().item<double>();
  }
  return sum;
}

void print_digest(const StateDict& state, int rank) {
  if (rank == 0) {
    std::printf("digest %.17g\n", digest(state));
    std::fflush(stdout);
  }
}

void train(ddp::FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer, ddp::ProcessGroup& group,
           int first, int last) {
  for (int step = first; step < last; ++step) {
    auto [x, y] = ddp_test::rank_batch(step, group.rank(), group.size());
    optimizer.zero_grad();
    (model(x) - y).pow(2).mean().backward();
    optimizer.step();
  }
}

int saved_step(const std::string& path) {
  std::ifstream in(path + ".step");
  int step = -1;
  in >> step;
  if (step < 0) {
    throw std::runtime_error("cannot read " + path + ".step");
  }
  return step;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::string(argv[1]) != "full" && std::string(argv[1]) != "load-full" && argc != 4)) {
    std::fprintf(stderr, "usage: fsdp_checkpoint_main save|resume <path> <steps> | load-full|full <path>\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string path = argv[2];
  try {
    torch::set_num_threads(1);
    if (mode == "full") {
      ddp_test::ThreeUnitNet plain;
      ddp::load_full_state_dict(*plain, ddp::read_sharded_checkpoint_full(path));
      print_digest(ddp::full_state_dict_of(*plain), 0);
      return 0;
    }
    auto group = ddp::init_process_group();
    ddp::FullyShardedDataParallel model(ddp_test::ThreeUnitNet{});
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
    if (mode == "save") {
      const int steps = std::stoi(argv[3]);
      train(model, optimizer, *group, 0, steps);
      ddp::save_sharded_checkpoint(model, optimizer, path);
      if (group->rank() == 0) {
        std::ofstream(path + ".step") << steps << "\n";
      }
    } else if (mode == "resume") {
      ddp::load_sharded_checkpoint(model, optimizer, path);
      const int first = saved_step(path);
      train(model, optimizer, *group, first, first + std::stoi(argv[3]));
    } else if (mode == "load-full") {
      model->load_full_state_dict(ddp::read_sharded_checkpoint_full(path));
    } else {
      std::fprintf(stderr, "fsdp_checkpoint_main: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    print_digest(model->full_state_dict(), group->rank());
    ddp::destroy_process_group();
    return 0;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "fsdp_checkpoint_main: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_checkpoint_main: %s\n", e.what());
  }
  return 1;
}
