#pragma once

// The `.metadata` file of a torch.distributed.checkpoint (DCP) directory,
// as PyTorch 2.11 writes and reads it (private header).
//
// It is a pickle of the dataclass `Metadata`: `state_dict_metadata` maps
// each key of the flattened state dict ("model.0.weight",
// "optim.state.0.weight.exp_avg", "optim.param_groups.0.lr") to a
// TensorStorageMetadata (dtype, global size, and the chunks that were
// saved: boxes of offsets and sizes) or a BytesStorageMetadata (any other
// object, torch.save'd); `storage_data` maps each chunk (key and offsets;
// key alone for bytes) to where it lies: a file of the directory, an
// offset and a length; `planner_data` maps each key to its path in the
// nested state dict ("optim.param_groups.0.lr" -> ('optim',
// 'param_groups', 0, 'lr')), for readers that rebuild the nesting. Each
// chunk is itself a torch.save archive of one tensor (torch_save.h).

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "checkpoint/pickle.h"

namespace ddp::checkpoint::dcp {

// The format version this code writes, and the ones it reads.
constexpr const char* kFormatVersion = "1.0.0";

// A box of a tensor: elements [offsets[d], offsets[d] + sizes[d]) in every
// dimension d.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t numel() const;
  bool operator==(const Box& other) const { return offsets == other.offsets && sizes == other.sizes; }
};

struct TensorEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  std::vector<Box> chunks;
};

struct BytesEntry {};

// One step of a key's path: a dict key or a list index.
using PathStep = std::variant<std::string, int64_t>;

// A chunk's place in storage_data: the key and, for a tensor, its offsets.
struct ChunkKey {
  std::string key;
  bool tensor = false;
  std::vector<int64_t> offsets;
  bool operator<(const ChunkKey& other) const {
    return std::tie(key, tensor, offsets) < std::tie(other.key, other.tensor, other.offsets);
  }
};

struct StorageInfo {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

struct Metadata {
  // In the order of the saved state dict.
  std::vector<std::pair<std::string, std::variant<TensorEntry, BytesEntry>>> entries;
  std::map<ChunkKey, StorageInfo> storage;
  std::vector<std::pair<std::string, std::vector<PathStep>>> planner_data;
  std::string version; // "" when the file has none
  std::string save_id;
  std::string checkpoint_id;

  const std::variant<TensorEntry, BytesEntry>* find(const std::string& key) const;
};

// The pickle Python's DCP writes for `metadata` (its dataclasses, protocol 2).
pickle::ValuePtr metadata_value(const Metadata& metadata);

// Reads a `.metadata` pickle. Throws std::runtime_error starting with
// `what` for anything that is not a DCP Metadata this code reads: another
// format version (naming the ones it reads), a malformed entry, a file name
// that leaves the directory, storage transforms (compression).
Metadata metadata_of(const pickle::Value& value, const std::string& what);

// The `.metadata` of the directory `dir`, read and checked.
Metadata read_metadata(const std::string& dir);

} // namespace ddp::checkpoint::dcp
