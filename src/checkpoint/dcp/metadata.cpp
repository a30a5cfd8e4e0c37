// DCP's `.metadata` both ways (metadata.h): the dataclasses of
// torch.distributed.checkpoint.metadata as pickle values.

#include "checkpoint/dcp/metadata.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>

#include "checkpoint/torch_save.h"

namespace ddp::checkpoint::dcp {

using pickle::Value;
using pickle::ValuePtr;

namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

ValuePtr cls(const char* module, const char* name) {
  return pickle::global(module, name);
}

ValuePtr str(const std::string& s) {
  return pickle::string(s);
}

ValuePtr torch_size(const std::vector<int64_t>& dims) {
  std::vector<ValuePtr> items;
  for (int64_t d : dims) {
    items.push_back(pickle::integer(d));
  }
  return pickle::call(pickle::global("torch", "Size"), {pickle::tuple(std::move(items))});
}

ValuePtr fields(std::vector<std::pair<std::string, ValuePtr>> named) {
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  for (auto& [k, v] : named) {
    entries.emplace_back(str(k), std::move(v));
  }
  return pickle::dict(std::move(entries));
}

ValuePtr tensor_entry(const TensorEntry& entry) {
  // TensorProperties pickles as a tuple (its __getstate__): dtype, layout,
  // requires_grad, memory format (an enum, 0 = contiguous), pin_memory.
  auto properties = pickle::object(
      cls(kMetadataModule, "TensorProperties"),
      pickle::tuple({pickle::global("torch", python_dtype_name(entry.dtype)),
                     pickle::call(pickle::global("torch.serialization", "_get_layout"), {str("torch.strided")}),
                     pickle::boolean(false),
                     pickle::call(cls(kMetadataModule, "_MEM_FORMAT_ENCODING"), {pickle::integer(0)}),
                     pickle::boolean(false)}));
  std::vector<ValuePtr> chunks;
  for (const auto& box : entry.chunks) {
    chunks.push_back(pickle::object(cls(kMetadataModule, "ChunkStorageMetadata"),
                                    fields({{"offsets", torch_size(box.offsets)}, {"sizes", torch_size(box.sizes)}})));
  }
  return pickle::object(cls(kMetadataModule, "TensorStorageMetadata"),
                        fields({{"properties", properties},
                                {"size", torch_size(entry.size)},
                                {"chunks", pickle::list(std::move(chunks))}}));
}

// ---- Reading ----------------------------------------------------------------

[[noreturn]] void bad(const std::string& what, const std::string& why) {
  throw std::runtime_error(what + ": " + why);
}

// The BUILD state of a dataclass object as a dict, checked.
const Value& state_of(const Value& object, const char* class_name, const std::string& what) {
  if (!object.is(Value::Kind::kCall) || !object.callable || !object.callable->is(Value::Kind::kGlobal) ||
      object.callable->name != class_name) {
    bad(what, c10::str("expected a ", class_name, ", found ", object.describe()));
  }
  if (!object.state || !object.state->is(Value::Kind::kDict)) {
    bad(what, c10::str("a ", class_name, " without its fields"));
  }
  return *object.state;
}

const Value& field(const Value& state, const char* name, const std::string& what) {
  const Value* v = state.get(name);
  if (v == nullptr) {
    bad(what, c10::str("no field '", name, "'"));
  }
  return *v;
}

std::vector<int64_t> size_of(const Value& value, const std::string& what) {
  const Value* tuple = &value;
  if (value.is(Value::Kind::kCall) && value.is_global("torch", "Size")) {
    if (value.items.size() != 1) {
      bad(what, "a torch.Size without its tuple");
    }
    tuple = value.items[0].get();
  }
  if (!tuple->is(Value::Kind::kTuple) && !tuple->is(Value::Kind::kList)) {
    bad(what, "expected a torch.Size, found " + value.describe());
  }
  std::vector<int64_t> out;
  for (const auto& item : tuple->items) {
    if (!item->is(Value::Kind::kInt) || item->integer < 0) {
      bad(what, "a torch.Size holding " + item->describe());
    }
    out.push_back(item->integer);
  }
  return out;
}

std::string string_field(const Value& state, const char* name, const std::string& what) {
  const Value& v = field(state, name, what);
  if (!v.is(Value::Kind::kString)) {
    bad(what, c10::str("field '", name, "' is ", v.describe(), ", expected a string"));
  }
  return v.text;
}

int64_t int_field(const Value& state, const char* name, const std::string& what) {
  const Value& v = field(state, name, what);
  if (!v.is(Value::Kind::kInt) || v.integer < 0) {
    bad(what, c10::str("field '", name, "' is ", v.describe(), ", expected a non-negative int"));
  }
  return v.integer;
}

at::ScalarType dtype_of(const Value& properties, const std::string& what) {
  const Value* dtype = nullptr;
  if (properties.state && properties.state->is(Value::Kind::kTuple) && !properties.state->items.empty()) {
    dtype = properties.state->items[0].get();
  } else if (properties.state && properties.state->is(Value::Kind::kDict)) {
    dtype = properties.state->get("dtype");
  }
  if (dtype == nullptr || !dtype->is(Value::Kind::kGlobal) || dtype->text != "torch") {
    bad(what, "tensor properties without a dtype");
  }
  const auto found = dtype_of_python_name(dtype->name);
  if (!found) {
    bad(what, "dtype torch." + dtype->name + " is not one ddp reads");
  }
  return *found;
}

TensorEntry read_tensor_entry(const Value& object, const std::string& what) {
  const Value& s = state_of(object, "TensorStorageMetadata", what);
  TensorEntry entry;
  entry.dtype = dtype_of(field(s, "properties", what), what);
  entry.size = size_of(field(s, "size", what), what + " size");
  const Value& chunks = field(s, "chunks", what);
  if (!chunks.is(Value::Kind::kList)) {
    bad(what, "its chunks are not a list");
  }
  for (const auto& chunk : chunks.items) {
    const Value& c = state_of(*chunk, "ChunkStorageMetadata", what + " chunk");
    Box box{size_of(field(c, "offsets", what), what + " chunk offsets"), size_of(field(c, "sizes", what), what + " chunk sizes")};
    if (box.offsets.size() != entry.size.size() || box.sizes.size() != entry.size.size()) {
      bad(what, c10::str("a chunk of ", box.offsets.size(), " dimensions in a tensor of ", entry.size.size()));
    }
    for (size_t d = 0; d < box.offsets.size(); ++d) {
      if (box.offsets[d] + box.sizes[d] > entry.size[d]) {
        bad(what, c10::str("a chunk at ", c10::IntArrayRef(box.offsets), " of size ", c10::IntArrayRef(box.sizes),
                           " lies outside the tensor's size ", c10::IntArrayRef(entry.size)));
      }
    }
    entry.chunks.push_back(std::move(box));
  }
  return entry;
}

} // namespace

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) {
    n *= s;
  }
  return n;
}

const std::variant<TensorEntry, BytesEntry>* Metadata::find(const std::string& key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) {
      return &v;
    }
  }
  return nullptr;
}

ValuePtr metadata_value(const Metadata& metadata) {
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;
  std::map<std::string, const TensorEntry*> tensors;
  for (const auto& [key, entry] : metadata.entries) {
    if (const auto* t = std::get_if<TensorEntry>(&entry)) {
      entries.emplace_back(str(key), tensor_entry(*t));
      tensors[key] = t;
    } else {
      entries.emplace_back(str(key), pickle::object(cls(kMetadataModule, "BytesStorageMetadata"), nullptr));
    }
  }
  std::vector<std::pair<ValuePtr, ValuePtr>> planner;
  for (const auto& [key, path] : metadata.planner_data) {
    std::vector<ValuePtr> steps;
    for (const auto& step : path) {
      steps.push_back(std::holds_alternative<int64_t>(step) ? pickle::integer(std::get<int64_t>(step))
                                                             : str(std::get<std::string>(step)));
    }
    planner.emplace_back(str(key), pickle::tuple(std::move(steps)));
  }
  std::vector<std::pair<ValuePtr, ValuePtr>> storage;
  for (const auto& [chunk, info] : metadata.storage) {
    ValuePtr offset = pickle::none();
    ValuePtr index = pickle::none();
    if (chunk.tensor) {
      offset = torch_size(chunk.offsets);
      // The chunk's position in its entry's list: a hint for the reader.
      const auto* t = tensors.at(chunk.key);
      for (size_t i = 0; i < t->chunks.size(); ++i) {
        if (t->chunks[i].offsets == chunk.offsets) {
          index = pickle::integer(static_cast<int64_t>(i));
        }
      }
    }
    auto key = pickle::object(cls(kMetadataModule, "MetadataIndex"),
                              fields({{"fqn", str(chunk.key)}, {"offset", offset}, {"index", index}}));
    auto value = pickle::object(cls(kFilesystemModule, "_StorageInfo"),
                                fields({{"relative_path", str(info.relative_path)},
                                        {"offset", pickle::integer(info.offset)},
                                        {"length", pickle::integer(info.length)}}));
    storage.emplace_back(std::move(key), std::move(value));
  }
  auto storage_meta = pickle::object(cls(kMetadataModule, "StorageMeta"),
                                     fields({{"checkpoint_id", str(metadata.checkpoint_id)},
                                             {"save_id", str(metadata.save_id)},
                                             {"load_id", pickle::none()},
                                             {"modules", pickle::list({})}}));
  return pickle::object(cls(kMetadataModule, "Metadata"),
                        fields({{"state_dict_metadata", pickle::dict(std::move(entries))},
                                {"planner_data", pickle::dict(std::move(planner))},
                                {"storage_data", pickle::dict(std::move(storage))},
                                {"storage_meta", storage_meta},
                                {"version", str(kFormatVersion)}}));
}

Metadata metadata_of(const Value& value, const std::string& what) {
  const Value& root = state_of(value, "Metadata", what);
  Metadata out;
  if (const Value* version = root.get("version"); version != nullptr && !version->is(Value::Kind::kNone)) {
    if (!version->is(Value::Kind::kString)) {
      bad(what, "its format version is " + version->describe());
    }
    out.version = version->text;
    if (out.version != kFormatVersion) {
      bad(what, c10::str("DCP format version '", out.version, "', which ddp does not read: ddp reads version ",
                         kFormatVersion, " (what PyTorch 2.11 writes) and the unversioned metadata of earlier "
                         "PyTorch 2.x releases"));
    }
  }
  const Value& entries = field(root, "state_dict_metadata", what);
  if (!entries.is(Value::Kind::kDict)) {
    bad(what, "state_dict_metadata is not a dict");
  }
  for (const auto& [k, v] : entries.entries) {
    if (!k->is(Value::Kind::kString)) {
      bad(what, "a key of state_dict_metadata is " + k->describe());
    }
    const std::string key_what = what + " '" + k->text + "'";
    if (v->is_global(kMetadataModule, "BytesStorageMetadata")) {
      out.entries.emplace_back(k->text, BytesEntry{});
    } else {
      out.entries.emplace_back(k->text, read_tensor_entry(*v, key_what));
    }
  }
  const Value& storage = field(root, "storage_data", what);
  if (!storage.is(Value::Kind::kDict)) {
    bad(what, "storage_data is not a dict");
  }
  for (const auto& [k, v] : storage.entries) {
    const Value& index = state_of(*k, "MetadataIndex", what + " storage_data");
    ChunkKey chunk;
    chunk.key = string_field(index, "fqn", what + " storage_data");
    const Value* offset = index.get("offset");
    if (offset != nullptr && !offset->is(Value::Kind::kNone)) {
      chunk.tensor = true;
      chunk.offsets = size_of(*offset, what + " '" + chunk.key + "' offset");
    }
    const std::string info_what = what + " storage of '" + chunk.key + "'";
    const Value& info = state_of(*v, "_StorageInfo", info_what);
    StorageInfo s;
    s.relative_path = string_field(info, "relative_path", info_what);
    s.offset = int_field(info, "offset", info_what);
    s.length = int_field(info, "length", info_what);
    if (const Value* transforms = info.get("transform_descriptors");
        transforms != nullptr && !transforms->is(Value::Kind::kNone) && !transforms->items.empty()) {
      bad(info_what, "it was saved through storage transforms (compression?), which ddp does not read");
    }
    if (s.relative_path.empty() || s.relative_path.find('/') != std::string::npos || s.relative_path == "." ||
        s.relative_path == "..") {
      bad(info_what, "file name '" + s.relative_path + "' is not a file of the checkpoint's directory");
    }
    out.storage[chunk] = s;
  }
  if (const Value* planner = root.get("planner_data"); planner != nullptr && planner->is(Value::Kind::kDict)) {
    for (const auto& [k, v] : planner->entries) {
      if (!k->is(Value::Kind::kString) || !v->is(Value::Kind::kTuple)) {
        continue; // another planner's data: not needed to read the tensors
      }
      std::vector<PathStep> path;
      for (const auto& step : v->items) {
        if (step->is(Value::Kind::kInt)) {
          path.emplace_back(step->integer);
        } else if (step->is(Value::Kind::kString)) {
          path.emplace_back(step->text);
        }
      }
      out.planner_data.emplace_back(k->text, std::move(path));
    }
  }
  return out;
}

Metadata read_metadata(const std::string& dir) {
  const std::string path = dir + "/.metadata";
  FileRange file(path);
  std::string bytes(file.size(), '\0');
  if (file.read(0, bytes.data(), bytes.size()) != bytes.size()) {
    throw std::runtime_error("cannot read '" + path + "'");
  }
  const std::string what = "'" + path + "'";
  pickle::Reader reader(bytes.data(), bytes.size(), what, {});
  return metadata_of(*reader.read(), what);
}

} // namespace ddp::checkpoint::dcp
