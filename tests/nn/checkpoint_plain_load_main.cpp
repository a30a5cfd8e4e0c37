// Reads a checkpoint written by ddp::save_checkpoint with nothing but
// LibTorch: a fresh module of the wrapped type and `torch::load(net, path)`.
// It does not link ddp, so that it shows what a user without ddp can do with
// the file. Run by ddp_join_checkpoint_main.
//
// Usage:
//   build/tests/ddp_checkpoint_plain_load CHECKPOINT OUT.txt
// writes the loaded parameters and buffers to OUT.txt, one "name values..."
// line each (ddp_test::write_state_text); exits 1 if loading fails.

#include <torch/torch.h>

#include <cstdio>
#include <exception>

#include "nn/closed_form.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ddp_checkpoint_plain_load CHECKPOINT OUT.txt\n");
    return 2;
  }
  try {
    auto net = ddp_test::make_bn_mlp(); // random init: everything must come from the file
    torch::load(net, argv[1]);
    if (!ddp_test::write_state_text(*net, argv[2])) {
      std::fprintf(stderr, "ddp_checkpoint_plain_load: cannot write %s\n", argv[2]);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_checkpoint_plain_load: torch::load(net, \"%s\") failed: %s\n",
                 argv[1], e.what());
    return 1;
  }
}
