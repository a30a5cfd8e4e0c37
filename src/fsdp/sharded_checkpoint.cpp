// Sharded checkpoints of FullyShardedDataParallel.
//
// How it works. A checkpoint at PATH is a set of files: one per rank,
// PATH.<save id>.rank<R>, holding that rank's shards (flat_param_<u>), its
// buffers (buffer_<i>) and, when saved with one, its optimizer's state over
// its shards (a nested archive "optimizer"); and PATH itself, a text
// manifest naming the set: the save id, the world size, each rank file's
// size and checksum, and the layout of the units (the entries of each flat
// parameter, every parameter and buffer name), so that the full state can be
// assembled without the model.
//
// Save (a collective): rank 0 draws the save id and broadcasts it; every
// rank writes and fsyncs its file under the id's name (no earlier manifest
// names it, so a half-written one is never read); the ranks gather each
// other's outcome, size and checksum; rank 0 writes the manifest to
// PATH.tmp.<pid>, fsyncs it and renames it to PATH: the commit; a broadcast
// tells every rank, which then removes its files of other save ids. A
// crash before the rename leaves the old PATH and the files it names; after
// it, the new set is complete. Whatever a crash left, the next save removes.
// Crash points for the tests (Note [Checkpoint crash points]):
// "sharded-rank-file" (a rank's file half written), "sharded-manifest"
// (every file written, no commit), "sharded-committed" (the rename done,
// old files not yet removed).

#include <ddp/comm/error.h>
#include <ddp/nn/sharded_checkpoint.h>

#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "fsdp/fsdp_state.h"
#include "internal/check.h"
#include "nn/checkpoint_files.h"

namespace ddp {

namespace {

using StateDict = torch::OrderedDict<std::string, at::Tensor>;
using detail::FsdpAccess;

constexpr const char* kMagic = "ddp_sharded_checkpoint";
constexpr int kFormatVersion = 1;

std::string rank_file(const std::string& path, const std::string& save_id, int rank) {
  return c10::str(path, ".", save_id, ".rank", rank);
}

// The manifest, as written and parsed.
struct Manifest {
  struct Entry {
    std::string name;
    int64_t offset = 0;
    int64_t numel = 0;
    std::vector<int64_t> shape;
  };
  struct Unit {
    int64_t padded = 0;
    int64_t shard = 0;
    std::vector<Entry> entries;
  };
  std::string save_id;
  int world = 0;
  bool has_optimizer = false;
  std::vector<Unit> units;
  std::vector<std::tuple<std::string, size_t, size_t>> params; // name, unit, entry
  std::vector<std::string> buffers;
  std::vector<std::pair<uint64_t, uint64_t>> files; // bytes, checksum per rank

  std::string text() const {
    std::ostringstream out;
    out << kMagic << " " << kFormatVersion << "\nsave_id " << save_id << "\nworld " << world << "\noptimizer "
        << (has_optimizer ? "yes" : "no") << "\n";
    for (size_t u = 0; u < units.size(); ++u) {
      out << "unit " << u << " " << units[u].padded << " " << units[u].shard << "\n";
      for (const auto& e : units[u].entries) {
        out << "entry " << u << " " << e.name << " " << e.offset << " " << e.numel << " " << e.shape.size();
        for (const auto d : e.shape) {
          out << " " << d;
        }
        out << "\n";
      }
    }
    for (const auto& [name, u, e] : params) {
      out << "param " << name << " " << u << " " << e << "\n";
    }
    for (const auto& name : buffers) {
      out << "buffer " << name << "\n";
    }
    for (size_t r = 0; r < files.size(); ++r) {
      out << "file " << r << " " << files[r].first << " " << internal::hex64(files[r].second) << "\n";
    }
    return out.str();
  }

  static Manifest read(const std::string& path) {
    std::ifstream in(path);
    DDP_CHECK(in.good(), "load_sharded_checkpoint: cannot open '", path, "': ", internal::errno_text(errno));
    auto bad = [&](const std::string& what) {
      DDP_CHECK(false, "load_sharded_checkpoint: '", path, "' is not a sharded checkpoint's manifest: ", what);
    };
    std::string magic;
    int version = 0;
    if (!(in >> magic >> version) || magic != kMagic) {
      bad(c10::str("expected a first line '", kMagic, " <version>'"));
    }
    DDP_CHECK(version <= kFormatVersion, "load_sharded_checkpoint: '", path, "' has format ", version,
              ", written by a newer ddp; this one reads ", kFormatVersion, " and older");
    Manifest m;
    std::string key;
    while (in >> key) {
      if (key == "save_id") {
        in >> m.save_id;
      } else if (key == "world") {
        in >> m.world;
      } else if (key == "optimizer") {
        std::string yes;
        in >> yes;
        m.has_optimizer = yes == "yes";
      } else if (key == "unit") {
        size_t u = 0;
        Unit unit;
        in >> u >> unit.padded >> unit.shard;
        if (!in || u != m.units.size()) {
          bad("a 'unit' line out of order");
        }
        m.units.push_back(unit);
      } else if (key == "entry") {
        size_t u = 0, ndim = 0;
        Entry e;
        in >> u >> e.name >> e.offset >> e.numel >> ndim;
        e.shape.resize(ndim);
        for (auto& d : e.shape) {
          in >> d;
        }
        if (!in || u >= m.units.size()) {
          bad("an 'entry' line of no unit");
        }
        m.units[u].entries.push_back(std::move(e));
      } else if (key == "param") {
        std::string name;
        size_t u = 0, e = 0;
        in >> name >> u >> e;
        if (!in || u >= m.units.size() || e >= m.units[u].entries.size()) {
          bad("a 'param' line of no entry");
        }
        m.params.emplace_back(name, u, e);
      } else if (key == "buffer") {
        std::string name;
        in >> name;
        m.buffers.push_back(name);
      } else if (key == "file") {
        size_t r = 0;
        uint64_t bytes = 0;
        std::string checksum;
        in >> r >> bytes >> checksum;
        if (!in || r != m.files.size()) {
          bad("a 'file' line out of order");
        }
        m.files.emplace_back(bytes, std::strtoull(checksum.c_str(), nullptr, 16));
      } else {
        std::string ignored;
        std::getline(in, ignored); // a later field of the same format
      }
    }
    if (m.save_id.size() != 16 || m.world < 1 || static_cast<int>(m.files.size()) != m.world) {
      bad("it is incomplete (save_id, world and one 'file' line per rank)");
    }
    return m;
  }
};

// The layout of `state`'s units and names, as the manifest records it.
Manifest layout_of(FullyShardedDataParallelImpl::State& state, torch::nn::Module& module) {
  Manifest m;
  for (const auto& unit : state.units) {
    Manifest::Unit u;
    u.padded = unit->padded_numel();
    u.shard = unit->shard_numel();
    for (const auto& entry : unit->entries()) {
      u.entries.push_back({entry.name, entry.offset, entry.numel, entry.shape});
    }
    m.units.push_back(std::move(u));
  }
  for (const auto& item : module.named_parameters()) {
    const auto& [u, e] = state.where.at(item.key());
    m.params.emplace_back(item.key(), u, e);
  }
  for (const auto& item : module.named_buffers()) {
    m.buffers.push_back(item.key());
  }
  return m;
}

// Removes files of `path`'s other saves that this rank wrote (and, on rank
// 0, temporary manifests). Best effort.
void remove_other_saves(const std::string& path, const std::string& keep_id, int rank) {
  const std::string base = internal::base_name_of(path);
  const std::string dir = internal::directory_of(path);
  const std::string suffix = c10::str(".rank", rank);
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    return;
  }
  std::vector<std::string> doomed;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.compare(0, base.size() + 1, base + ".") != 0) {
      continue;
    }
    const std::string rest = name.substr(base.size() + 1);
    const bool other_save = rest.size() == 16 + suffix.size() && rest.compare(16, std::string::npos, suffix) == 0 &&
                            internal::all_of_chars(rest.substr(0, 16), 0, "0123456789abcdef") &&
                            rest.compare(0, 16, keep_id) != 0;
    const bool tmp_manifest = rank == 0 && rest.compare(0, 4, "tmp.") == 0 &&
                              internal::all_of_chars(rest, 4, "0123456789");
    if (other_save || tmp_manifest) {
      doomed.push_back(dir + "/" + name);
    }
  }
  ::closedir(listing);
  for (const auto& file : doomed) {
    std::remove(file.c_str());
  }
}

void save(FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer, const std::string& path) {
  auto& state = FsdpAccess::state(*model);
  auto& module = FsdpAccess::module(*model);
  ProcessGroup& group = *state.group;
  const int rank = group.rank();
  const std::string who = c10::str("[rank ", rank, "/", group.size(), "] save_sharded_checkpoint");
  DDP_CHECK(!state.in_forward, who, ": called during forward");
  const c10::Device device = state.units.empty() ? c10::Device(c10::kCPU) : state.units.front()->device();

  // The save id, rank 0's.
  auto id = torch::zeros({16}, torch::kUInt8);
  if (rank == 0) {
    const std::string text = internal::new_save_id();
    std::memcpy(id.data_ptr(), text.data(), 16);
  }
  id = id.to(device);
  group.broadcast(id, BroadcastOptions{0})->wait();
  id = id.cpu();
  const std::string save_id(static_cast<const char*>(id.data_ptr()), 16);

  // Every rank's file.
  std::string error;
  uint64_t bytes = 0, checksum = 0;
  try {
    torch::serialize::OutputArchive archive;
    torch::NoGradGuard no_grad;
    for (size_t u = 0; u < state.units.size(); ++u) {
      archive.write("flat_param_" + std::to_string(u), state.units[u]->shard().detach().cpu());
    }
    size_t b = 0;
    for (const auto& item : module.named_buffers()) {
      archive.write("buffer_" + std::to_string(b++), item.value().detach().cpu(), /*is_buffer=*/true);
    }
    if (optimizer != nullptr) {
      torch::serialize::OutputArchive nested;
      optimizer->save(nested);
      archive.write("optimizer", nested);
    }
    internal::NewFile file(rank_file(path, save_id, rank));
    file.save(archive);
    internal::crash_point("sharded-rank-file", &file);
    file.finish();
    bytes = file.checksum().size();
    checksum = file.checksum().value();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  auto mine = torch::tensor({error.empty() ? int64_t{1} : int64_t{0}, static_cast<int64_t>(bytes),
                             static_cast<int64_t>(checksum)},
                            torch::kLong)
                  .to(device);
  std::vector<at::Tensor> all;
  for (int r = 0; r < group.size(); ++r) {
    all.push_back(torch::empty_like(mine));
  }
  group.allgather(all, mine)->wait();
  Manifest manifest = layout_of(state, module);
  manifest.save_id = save_id;
  manifest.world = group.size();
  manifest.has_optimizer = optimizer != nullptr;
  std::string failed;
  for (int r = 0; r < group.size(); ++r) {
    const auto values = all[static_cast<size_t>(r)].cpu();
    const auto* v = values.data_ptr<int64_t>();
    if (v[0] == 0) {
      failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    }
    manifest.files.emplace_back(static_cast<uint64_t>(v[1]), static_cast<uint64_t>(v[2]));
  }
  DDP_CHECK(failed.empty(), who, ": rank(s) ", failed, " could not write their file",
            error.empty() ? std::string() : " (this rank: " + error + ")", "; '", path, "' is unchanged");

  // The commit, on rank 0.
  std::string commit_error;
  if (rank == 0) {
    try {
      const std::string tmp = c10::str(path, ".tmp.", ::getpid());
      internal::NewFile file(tmp);
      const std::string text = manifest.text();
      if (file.write(text.data(), text.size()) != text.size()) {
        throw std::runtime_error(c10::str("cannot write '", tmp, "'"));
      }
      internal::crash_point("sharded-manifest");
      file.finish();
      internal::rename_file(tmp, path);
      internal::sync_directory(internal::directory_of(path));
      internal::crash_point("sharded-committed");
    } catch (const std::exception& e) {
      commit_error = error_message(e);
    }
  }
  auto committed = torch::tensor({commit_error.empty() ? int64_t{1} : int64_t{0}}, torch::kLong).to(device);
  group.broadcast(committed, BroadcastOptions{0})->wait();
  DDP_CHECK(committed.cpu().item<int64_t>() == 1, who, ": rank 0 could not write the manifest '", path, "'",
            commit_error.empty() ? std::string() : ": " + commit_error, "; the previous save stays");
  remove_other_saves(path, save_id, rank);
}

// Reads rank `rank`'s file of the set, after checking it against the manifest.
torch::serialize::InputArchive open_rank_file(const std::string& path, const Manifest& manifest, int rank) {
  const std::string file = rank_file(path, manifest.save_id, rank);
  const auto found = internal::checksum_of_file(file);
  DDP_CHECK(found, "load_sharded_checkpoint: '", file, "', which the manifest '", path,
            "' names, does not exist: the set is incomplete (copy every rank's file with the manifest)");
  const auto& [bytes, checksum] = manifest.files[static_cast<size_t>(rank)];
  DDP_CHECK(found->size() == bytes && found->value() == checksum, "load_sharded_checkpoint: '", file,
            "' does not match the manifest '", path, "' (", found->size(), " bytes, checksum ",
            internal::hex64(found->value()), "; expected ", bytes, " bytes, checksum ", internal::hex64(checksum),
            "): it is damaged or from another save");
  torch::serialize::InputArchive archive;
  archive.load_from(file);
  return archive;
}

void load(FullyShardedDataParallel& model, torch::optim::Optimizer* optimizer, const std::string& path) {
  auto& state = FsdpAccess::state(*model);
  auto& module = FsdpAccess::module(*model);
  const int rank = state.group->rank();
  const std::string who = c10::str("[rank ", rank, "/", state.group->size(), "] load_sharded_checkpoint");
  const Manifest manifest = Manifest::read(path);
  DDP_CHECK(manifest.world == state.group->size(), who, ": '", path, "' was written on ", manifest.world,
            " ranks and this job has ", state.group->size(),
            "; load it as a full state: model->load_full_state_dict(ddp::read_sharded_checkpoint_full(path))");
  const Manifest mine = layout_of(state, module);
  bool same = mine.units.size() == manifest.units.size() && mine.buffers == manifest.buffers;
  for (size_t u = 0; same && u < mine.units.size(); ++u) {
    const auto& a = mine.units[u];
    const auto& b = manifest.units[u];
    same = a.padded == b.padded && a.shard == b.shard && a.entries.size() == b.entries.size();
    for (size_t e = 0; same && e < a.entries.size(); ++e) {
      same = a.entries[e].name == b.entries[e].name && a.entries[e].shape == b.entries[e].shape;
    }
  }
  DDP_CHECK(same, who, ": '", path, "' holds other units than this model's (names, shapes or buffers differ)");
  DDP_CHECK(optimizer == nullptr || manifest.has_optimizer, who, ": '", path,
            "' was saved without an optimizer state");
  auto archive = open_rank_file(path, manifest, rank);
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < state.units.size(); ++u) {
    at::Tensor shard;
    archive.read("flat_param_" + std::to_string(u), shard);
    state.units[u]->shard().copy_(shard);
    state.units[u]->mark_stale();
  }
  size_t b = 0;
  for (auto& item : module.named_buffers()) {
    at::Tensor value;
    archive.read("buffer_" + std::to_string(b++), value, /*is_buffer=*/true);
    item.value().copy_(value);
  }
  if (optimizer != nullptr) {
    torch::serialize::InputArchive nested;
    archive.read("optimizer", nested);
    optimizer->load(nested);
  }
}

} // namespace

void save_sharded_checkpoint(FullyShardedDataParallel& model, const std::string& path) {
  save(model, nullptr, path);
}

void save_sharded_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                             const std::string& path) {
  save(model, &optimizer, path);
}

void load_sharded_checkpoint(FullyShardedDataParallel& model, const std::string& path) {
  load(model, nullptr, path);
}

void load_sharded_checkpoint(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                             const std::string& path) {
  load(model, &optimizer, path);
}

int sharded_checkpoint_world_size(const std::string& path) {
  return Manifest::read(path).world;
}

StateDict read_sharded_checkpoint_full(const std::string& path) {
  const Manifest manifest = Manifest::read(path);
  std::vector<std::vector<at::Tensor>> shards(manifest.units.size());
  at::Tensor buffers_source;
  std::vector<at::Tensor> buffers;
  for (int r = 0; r < manifest.world; ++r) {
    auto archive = open_rank_file(path, manifest, r);
    for (size_t u = 0; u < manifest.units.size(); ++u) {
      at::Tensor shard;
      archive.read("flat_param_" + std::to_string(u), shard);
      DDP_CHECK(shard.numel() == manifest.units[u].shard, "read_sharded_checkpoint_full: rank ", r,
                "'s shard of unit ", u, " has ", shard.numel(), " elements, the manifest says ",
                manifest.units[u].shard);
      shards[u].push_back(shard);
    }
    if (r == 0) {
      for (size_t b = 0; b < manifest.buffers.size(); ++b) {
        at::Tensor value;
        archive.read("buffer_" + std::to_string(b), value, /*is_buffer=*/true);
        buffers.push_back(value);
      }
    }
  }
  std::vector<at::Tensor> fulls;
  for (auto& pieces : shards) {
    fulls.push_back(torch::cat(pieces));
  }
  StateDict state;
  for (const auto& [name, u, e] : manifest.params) {
    const auto& entry = manifest.units[u].entries[e];
    state.insert(name, fulls[u].narrow(0, entry.offset, entry.numel).view(entry.shape).clone());
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    state.insert(manifest.buffers[b], buffers[b]);
  }
  return state;
}

} // namespace ddp
