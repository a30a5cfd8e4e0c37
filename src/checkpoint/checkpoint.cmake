# Checkpoints that leave C++: state dicts with PyTorch's names and layouts,
# torch.save's format (a pickler of our own over LibTorch's zip layer),
# safetensors, and torch.distributed.checkpoint directories (src/checkpoint/dcp/).
ddp_add_part(ddp_checkpoint
  src/checkpoint/pickle_writer.cpp
  src/checkpoint/pickle_reader.cpp
  src/checkpoint/torch_save.cpp
  src/checkpoint/module_state.cpp
  src/checkpoint/optimizer_state.cpp
  src/checkpoint/torch_format.cpp
  src/checkpoint/torch_checkpoint.cpp
  src/checkpoint/agree.cpp
  src/checkpoint/safetensors.cpp
  src/checkpoint/dcp/metadata.cpp
  src/checkpoint/dcp/boxes.cpp
  src/checkpoint/dcp/items.cpp
  src/checkpoint/dcp/fsdp_items.cpp
  src/checkpoint/dcp/dcp_save.cpp
  src/checkpoint/dcp/dcp_load.cpp
  src/checkpoint/dcp/dcp.cpp)
target_precompile_headers(ddp_checkpoint REUSE_FROM ddp_nn)
