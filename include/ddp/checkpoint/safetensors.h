#pragma once

/// safetensors files (https://github.com/huggingface/safetensors): an
/// 8-byte little-endian header length, a JSON header naming each tensor's
/// dtype, shape and byte range, then the tensors' bytes. The format the
/// Hugging Face ecosystem publishes models in; Python reads one with
/// `safetensors.torch.load_file(path)`.
///
/// ```
/// ddp::save_safetensors(model->full_state_dict(), "model.safetensors");
/// auto state = ddp::load_safetensors("model.safetensors");
/// ddp::load_module_state_dict(*net, state);
/// ```

#include <map>
#include <string>

#include <ddp/checkpoint/state_dict.h>

namespace ddp {

/// Writes `state` to `path` (atomically: a temporary name, fsync, rename),
/// tensors in their own dtype and shape, copied to the CPU one at a time.
/// `metadata` goes to the header's "__metadata__" ({"format": "pt"} when
/// empty, as safetensors.torch.save_file writes). Throws c10::Error naming
/// the file, or a tensor whose dtype safetensors has no name for.
void save_safetensors(const StateDict& state, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of the safetensors file at `path` onto the CPU, in the
/// header's order. Checks the header (its length, the JSON, each dtype,
/// shape and byte range, against each other and the file's size) and throws
/// c10::Error naming the file and the key at fault, never reading past what
/// the file holds.
StateDict load_safetensors(const std::string& path);

/// The header's "__metadata__" of the safetensors file at `path`.
std::map<std::string, std::string> safetensors_metadata(const std::string& path);

} // namespace ddp
