// Prints the defaults of FullyShardedDataParallel's options that have a
// PyTorch counterpart, one "name=value" a line, for defaults_parity.sh to
// compare with PyTorch's own (FullStateDictConfig(), FSDP's constructor).

#include <cstdio>

#include <ddp/nn/fully_sharded_data_parallel.h>

int main() {
  const ddp::FullStateDictOptions full;
  const ddp::FullyShardedDataParallelOptions fsdp;
  std::printf("FullStateDictConfig.rank0_only=%d\n", full.rank0_only() ? 1 : 0);
  std::printf("FullStateDictConfig.offload_to_cpu=%d\n", full.offload_to_cpu() ? 1 : 0);
  std::printf("FullyShardedDataParallel.sync_module_states=%d\n", fsdp.sync_module_states() ? 1 : 0);
  std::printf("FullyShardedDataParallel.forward_prefetch=%d\n", fsdp.forward_prefetch() ? 1 : 0);
  return 0;
}
