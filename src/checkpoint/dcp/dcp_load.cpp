// Loading a DCP directory (engine.h).
//
// How it works. Every rank reads `.metadata` and builds its destinations
// (items.h): the boxes of each tensor it holds, with views of its memory.
// First, checked (a collective exchange: every rank learns every rank's
// verdict before any value changes): each destination's key is in the
// checkpoint with the same dtype and size (strict: nothing missing, nothing
// unexpected); the saved chunks that overlap each destination box cover it
// whole; every such chunk has a file, which exists and is long enough; the
// optimizer's groups match the checkpoint's (their options are read here,
// small). Then read: chunk by chunk in file order, each chunk (a torch.save
// archive of one tensor) read whole, its overlap with each destination box
// copied in, and dropped before the next, so that a rank holds its own
// state plus one chunk. Last, the optimizer's new states and options are
// installed (a second exchange reports read errors on every rank).

#include <torch/torch.h>

#include <sys/stat.h>

#include <algorithm>
#include <map>

#include "checkpoint/agree.h"
#include "checkpoint/dcp/boxes.h"
#include "checkpoint/dcp/engine.h"
#include "checkpoint/torch_format_values.h"
#include "checkpoint/torch_save.h"
#include "internal/check.h"
#include "nn/checkpoint_files.h"

namespace ddp::checkpoint::dcp {

namespace {

std::string list(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < 10; ++i) {
    text += (i == 0 ? "" : ", ") + names[i];
  }
  return names.size() > 10 ? c10::str(text, " and ", names.size() - 10, " more") : text;
}

const StorageInfo& storage_of(const Metadata& metadata, const ChunkKey& chunk, const std::string& dir) {
  const auto found = metadata.storage.find(chunk);
  if (found == metadata.storage.end()) {
    throw std::runtime_error(c10::str("'", dir, "/.metadata' names no file for '", chunk.key, "'",
                                      chunk.tensor ? c10::str(" at ", c10::IntArrayRef(chunk.offsets)) : std::string()));
  }
  return found->second;
}

// One destination box's share of a saved chunk.
struct Copy {
  size_t item;
  Box overlap;
};

// A saved chunk to read, and where its parts go.
struct ChunkRead {
  std::string key;
  size_t chunk;
  StorageInfo where;
  std::vector<Copy> copies;
};

} // namespace

at::Tensor read_chunk(const std::string& dir, const Metadata& metadata, const std::string& key, size_t chunk) {
  const auto& entry = std::get<TensorEntry>(*metadata.find(key));
  const Box& box = entry.chunks.at(chunk);
  const StorageInfo& info = storage_of(metadata, ChunkKey{key, true, box.offsets}, dir);
  const std::string path = dir + "/" + info.relative_path;
  const std::string what = c10::str("'", path, "' (bytes ", info.offset, " to ", info.offset + info.length, ", '",
                                    key, "' at ", c10::IntArrayRef(box.offsets), ")");
  const auto value = read_torch_archive(std::make_shared<FileRange>(path, info.offset, info.length), what);
  if (!value->is(pickle::Value::Kind::kTensor)) {
    throw std::runtime_error(what + " holds " + value->describe() + ", expected a tensor");
  }
  const at::Tensor& t = value->tensor;
  if (t.scalar_type() != entry.dtype || t.sizes().vec() != box.sizes) {
    throw std::runtime_error(c10::str(what, " holds a tensor ", t.scalar_type(), t.sizes(), ", the metadata says ",
                                      entry.dtype, c10::IntArrayRef(box.sizes)));
  }
  return t;
}

pickle::ValuePtr read_bytes(const std::string& dir, const Metadata& metadata, const std::string& key) {
  const StorageInfo& info = storage_of(metadata, ChunkKey{key, false, {}}, dir);
  const std::string path = dir + "/" + info.relative_path;
  return read_torch_archive(std::make_shared<FileRange>(path, info.offset, info.length),
                            c10::str("'", path, "' (bytes ", info.offset, " to ", info.offset + info.length, ", '", key,
                                     "')"));
}

IncompatibleKeys load_items_from(const std::shared_ptr<ProcessGroup>& group, const std::string& dir, bool strict,
                                 const std::function<LoadItems(const Metadata&)>& build) {
  const std::string prefix = group ? who(*group, "dcp::load") : std::string("dcp::load");
  Metadata metadata;
  LoadItems items;
  std::vector<ChunkRead> reads;
  std::vector<std::pair<size_t, size_t>> steps; // (steps index, chunk 0 of its key)

  // ---- Check ----
  exchange(group, prefix, [&] {
    metadata = read_metadata(dir);
    items = build(metadata);
    std::vector<std::string> missing, unexpected, problems;
    // Tensors.
    std::vector<TensorItem> kept;
    std::map<std::pair<std::string, size_t>, size_t> read_of; // (key, chunk) -> reads index
    for (auto& item : items.tensors) {
      const auto* entry = metadata.find(item.key);
      if (entry == nullptr) {
        missing.push_back(item.key);
        continue;
      }
      const auto* t = std::get_if<TensorEntry>(entry);
      if (t == nullptr) {
        problems.push_back(c10::str("'", item.key, "' is an object in the checkpoint, a tensor here"));
        continue;
      }
      if (t->dtype != item.dtype || t->size != item.size) {
        problems.push_back(c10::str("'", item.key, "' is ", t->dtype, c10::IntArrayRef(t->size),
                                    " in the checkpoint, ", item.dtype, c10::IntArrayRef(item.size), " here"));
        continue;
      }
      const size_t index = kept.size();
      int64_t covered = 0;
      for (size_t c = 0; c < t->chunks.size(); ++c) {
        const auto overlap = intersect(t->chunks[c], item.box);
        if (!overlap) {
          continue;
        }
        covered += overlap->numel();
        auto found = read_of.find({item.key, c});
        if (found == read_of.end()) {
          found = read_of.emplace(std::make_pair(item.key, c), reads.size()).first;
          reads.push_back({item.key, c, storage_of(metadata, ChunkKey{item.key, true, t->chunks[c].offsets}, dir), {}});
        }
        reads[found->second].copies.push_back({index, *overlap});
      }
      if (covered != item.box.numel()) {
        problems.push_back(c10::str("'", item.key, "': the checkpoint's chunks hold ", covered, " of the ",
                                    item.box.numel(), " elements this rank needs at ",
                                    c10::IntArrayRef(item.box.offsets), " (a chunk missing from the metadata?)"));
      }
      kept.push_back(std::move(item));
    }
    items.tensors = std::move(kept);
    for (size_t i = 0; i < items.steps.size(); ++i) {
      const auto* entry = metadata.find(items.steps[i].first);
      const auto* t = entry != nullptr ? std::get_if<TensorEntry>(entry) : nullptr;
      if (t == nullptr || t->chunks.size() != 1 || t->chunks[0].numel() != 1) {
        problems.push_back(c10::str("'", items.steps[i].first, "' is not a one-element tensor in the checkpoint"));
        continue;
      }
      storage_of(metadata, ChunkKey{items.steps[i].first, true, t->chunks[0].offsets}, dir);
      steps.emplace_back(i, 0);
    }
    // What the checkpoint has and this model lacks.
    const auto saved = saved_states(metadata);
    for (const auto& [key, entry] : metadata.entries) {
      if (key.compare(0, 6, "model.") == 0 && items.model_keys.count(key) == 0) {
        unexpected.push_back(key);
      }
    }
    // Every file long enough for what is read from it.
    std::map<std::string, int64_t> needed;
    auto need = [&](const StorageInfo& where) {
      needed[where.relative_path] = std::max(needed[where.relative_path], where.offset + where.length);
    };
    for (const auto& r : reads) {
      need(r.where);
    }
    for (const auto& [chunk, where] : metadata.storage) {
      if (!chunk.tensor && chunk.key.compare(0, 19, "optim.param_groups.") == 0 && items.has_optimizer) {
        need(where);
      }
    }
    for (const auto& [name, end] : needed) {
      struct stat st {};
      const std::string path = dir + "/" + name;
      if (::stat(path.c_str(), &st) != 0) {
        throw std::runtime_error(c10::str("'", path, "', a file the checkpoint's metadata names, is missing: ",
                                          internal::errno_text(errno)));
      }
      if (st.st_size < end) {
        throw std::runtime_error(c10::str("'", path, "' has ", st.st_size, " bytes, the metadata names bytes up to ",
                                          end, " (truncated?)"));
      }
    }
    if (items.has_optimizer) {
      for (const auto& [name, states] : saved) {
        if (items.optim_names.count(name) == 0) {
          unexpected.push_back("optim.state." + name + ".*");
        }
      }
      // The groups' options (small objects), read now.
      const std::string groups_prefix = "optim.param_groups.";
      for (const auto& [key, entry] : metadata.entries) {
        if (key.compare(0, groups_prefix.size(), groups_prefix) != 0) {
          continue;
        }
        const size_t dot = key.find('.', groups_prefix.size());
        const std::string index = key.substr(groups_prefix.size(), dot - groups_prefix.size());
        if (dot == std::string::npos || index.empty() || index.size() > 6 ||
            index.find_first_not_of("0123456789") != std::string::npos) {
          problems.push_back("'" + key + "' is not optim.param_groups.<index>.<option>");
          continue;
        }
        const size_t g = std::stoul(index);
        if (items.group_options.size() <= g) {
          items.group_options.resize(g + 1);
        }
        const auto value = read_bytes(dir, metadata, key);
        items.group_options[g].emplace_back(key.substr(dot + 1), to_ivalue(*value, "'" + key + "'"));
      }
    }
    if (strict && !missing.empty()) {
      problems.push_back("missing from the checkpoint: " + list(missing));
    }
    if (strict && !unexpected.empty()) {
      problems.push_back("in the checkpoint and not in this model: " + list(unexpected));
    }
    if (!problems.empty()) {
      std::string text;
      for (const auto& p : problems) {
        text += (text.empty() ? "" : "; ") + p;
      }
      throw std::runtime_error(c10::str("'", dir, "' does not fit this model: ", text,
                                        strict && (!missing.empty() || !unexpected.empty())
                                            ? " (LoadOptions().strict(false) loads what matches)"
                                            : ""));
    }
    items.keys.missing_keys = missing;
    items.keys.unexpected_keys = unexpected;
    if (items.has_optimizer) {
      items.prepare(items);
    }
    return std::string();
  });

  // ---- Read ----
  exchange(group, prefix, [&] {
    std::sort(reads.begin(), reads.end(), [](const ChunkRead& a, const ChunkRead& b) {
      return std::tie(a.where.relative_path, a.where.offset) < std::tie(b.where.relative_path, b.where.offset);
    });
    at::NoGradGuard no_grad;
    for (const auto& r : reads) {
      const at::Tensor chunk = read_chunk(dir, metadata, r.key, r.chunk);
      const Box& box = std::get<TensorEntry>(*metadata.find(r.key)).chunks[r.chunk];
      for (const auto& c : r.copies) {
        const auto& item = items.tensors[c.item];
        narrow_to(item.data, item.box, c.overlap).copy_(narrow_to(chunk, box, c.overlap));
      }
    }
    for (const auto& [i, chunk] : steps) {
      const at::Tensor t = read_chunk(dir, metadata, items.steps[i].first, chunk);
      const double step = t.to(at::kDouble).reshape({}).item<double>();
      if (!(step >= 0) || step != static_cast<double>(static_cast<int64_t>(step))) {
        throw std::runtime_error(c10::str("'", items.steps[i].first, "' is ", step, ", expected a whole number"));
      }
      items.steps[i].second(static_cast<int64_t>(step));
    }
    items.commit();
    return std::string();
  });
  return items.keys;
}

} // namespace ddp::checkpoint::dcp
