// How it works
//
// A checkpoint at PATH is a pair of files: PATH, the wrapped module's state
// (what torch::save(module, PATH) writes, so that plain LibTorch reads it
// with torch::load), and PATH.optimizer, the optimizer's state (what
// torch::save(optimizer, ...) writes). Two files cannot be replaced by one
// rename, so one of them is the commit point: PATH. Besides the module's
// tensors, PATH holds a manifest (a string under kManifestKey, which
// torch::load ignores) naming the optimizer state that belongs to it: its
// size in bytes and a checksum of its bytes, and a save id.
//
// Rank 0 saves in this order (see Note [Checkpoint commit]):
//   1. removes the temporary files of saves that were killed (PATH.tmp.<pid>);
//   2. writes the optimizer state to PATH.optimizer.<save id> (the pending
//      file), counting its bytes and checksum as they are written; fsync;
//   3. writes the module's state and the manifest to PATH.tmp.<pid>; fsync;
//   4. renames PATH.tmp.<pid> to PATH, and fsyncs the directory: the commit;
//   5. renames the pending file to PATH.optimizer; fsync of the directory;
//   6. removes pending files of earlier killed saves.
// A crash before 4 leaves the old PATH and the old optimizer state, which
// its manifest names, untouched. A crash between 4 and 5 leaves the new PATH
// next to the old PATH.optimizer: the loader sees that the old file does not
// match the manifest and reads the pending file, which does. After 5 the new
// pair is in place. Whatever a crash leaves behind, the next save removes.
//
// A model whose communication hook has a state (PowerSGD's error feedback
// and warm-start matrices, post-local SGD's iteration) gets it saved too:
// every rank's `CommHookState::save_state` is gathered to rank 0, which
// writes them into PATH under kHookStateKey (the hook's kind and one byte
// tensor per rank), so they are committed with the model by the same rename.
// Loading hands every rank the states of all ranks (the state picks its
// own, or copes with a run of another size).
//
// Loading reads the manifest from PATH and refuses an optimizer file whose
// size or checksum differs from it, so that a model from one save is never
// paired with the optimizer state of another. A PATH without a manifest was
// written by an older ddp (or by torch::save): it loads as before, with its
// PATH.optimizer unchecked.

#include <ddp/comm/error.h>
#include <ddp/nn/checkpoint.h>
#include <ddp/optim/zero_redundancy_optimizer.h>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "comm/collective_label.h"
#include "internal/check.h"
#include "nn/checkpoint_files.h"
#include "internal/env.h"
#include "internal/logging.h"

namespace ddp {

namespace {

using namespace internal; // checkpoint_files.h

// The key of the manifest in the model file's archive. torch::load(module)
// reads only the module's own names, so a plain program never sees it.
constexpr const char* kManifestKey = "ddp_checkpoint_manifest";
// The manifest's first line; the number is the format version.
constexpr const char* kManifestMagic = "ddp_checkpoint";
constexpr int kFormatVersion = 1;
// The key of the communication hook's state in the model file's archive.
constexpr const char* kHookStateKey = "ddp_comm_hook_state";

// A hook's state as saved: its kind, and what each rank's save_state gave.
struct HookStates {
  std::string kind;
  std::vector<std::string> ranks;
};

std::string who(const ProcessGroup& group, const char* op) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] ", op);
}

// ---- Paths ---------------------------------------------------------------------

std::string optimizer_path(const std::string& path) {
  return path + ".optimizer";
}

std::string pending_optimizer_path(const std::string& path, const std::string& save_id) {
  return optimizer_path(path) + "." + save_id;
}

// Removes the files of `path`'s killed saves from its directory: temporary
// model files (PATH.tmp.<pid>, and PATH.optimizer.tmp.<pid> of older ddp
// versions) and, when `pending_too`, pending optimizer files
// (PATH.optimizer.<save id>). Best effort: a file that cannot be removed
// now is tried again at the next save.
void remove_leftovers(const std::string& path, bool pending_too) {
  const std::string base = base_name_of(path);
  const std::string tmp_prefix = base + ".tmp.";
  const std::string old_tmp_prefix = base + ".optimizer.tmp.";
  const std::string pending_prefix = base + ".optimizer.";
  const std::string dir = directory_of(path);
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    return;
  }
  std::vector<std::string> doomed;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    const auto has = [&](const std::string& prefix, const char* rest) {
      return name.compare(0, prefix.size(), prefix) == 0 && all_of_chars(name, prefix.size(), rest);
    };
    if (has(tmp_prefix, "0123456789") || has(old_tmp_prefix, "0123456789") ||
        (pending_too && has(pending_prefix, "0123456789abcdef") &&
         name.size() == pending_prefix.size() + 16)) {
      doomed.push_back(dir + "/" + name);
    }
  }
  ::closedir(listing);
  for (const std::string& file : doomed) {
    std::remove(file.c_str());
  }
}

// ---- Manifest ----------------------------------------------------------------------

struct Manifest {
  int version = kFormatVersion;
  std::string save_id;
  bool has_optimizer = false;
  uint64_t optimizer_bytes = 0;
  uint64_t optimizer_checksum = 0;

  std::string text() const {
    std::ostringstream out;
    out << kManifestMagic << " " << version << "\n"
        << "save_id " << save_id << "\n";
    if (has_optimizer) {
      out << "optimizer " << optimizer_bytes << " " << hex64(optimizer_checksum) << "\n";
    } else {
      out << "optimizer none\n";
    }
    return out.str();
  }

  // "20312 bytes, checksum 9f2c..."
  std::string optimizer_text() const {
    return c10::str(optimizer_bytes, " bytes, checksum ", hex64(optimizer_checksum));
  }

  // Parses text(); throws std::runtime_error naming what is wrong.
  static Manifest parse(const std::string& text) {
    Manifest m;
    std::istringstream in(text);
    std::string magic;
    if (!(in >> magic >> m.version) || magic != kManifestMagic) {
      throw std::runtime_error("its manifest is unreadable (expected a first line '" +
                               std::string(kManifestMagic) + " <version>')");
    }
    if (m.version > kFormatVersion) {
      throw std::runtime_error(c10::str("it was written in checkpoint format ", m.version,
                                        " by a newer ddp; this one reads format ",
                                        kFormatVersion, " and older"));
    }
    std::string key;
    bool has_id = false;
    bool has_optimizer_line = false;
    while (in >> key) {
      if (key == "save_id") {
        has_id = static_cast<bool>(in >> m.save_id);
      } else if (key == "optimizer") {
        std::string bytes;
        in >> bytes;
        has_optimizer_line = static_cast<bool>(in);
        if (bytes != "none") {
          std::string checksum;
          in >> checksum;
          m.has_optimizer = true;
          m.optimizer_bytes = std::strtoull(bytes.c_str(), nullptr, 10);
          m.optimizer_checksum = std::strtoull(checksum.c_str(), nullptr, 16);
          has_optimizer_line = static_cast<bool>(in);
        }
      } else {
        std::string ignored;
        std::getline(in, ignored); // a later field of the same format
      }
    }
    if (!has_id || !has_optimizer_line ||
        !all_of_chars(m.save_id, 0, "0123456789abcdef") || m.save_id.size() != 16) {
      throw std::runtime_error("its manifest is incomplete (expected 'save_id' and "
                               "'optimizer' lines): '" + text + "'");
    }
    return m;
  }
};

// ---- Save ---------------------------------------------------------------------------

// Note [Checkpoint commit]: the rename of PATH.tmp.<pid> to PATH is the
// only step that changes which save a reader gets; every file it depends on
// is complete and fsync'ed before it. See the narrative at the top.
void write_checkpoint(const DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
                      const HookStates* hook_states, const std::string& path) {
  const std::shared_ptr<torch::nn::Module> module = model->module();
  for (const char* key : {kManifestKey, kHookStateKey}) {
    DDP_CHECK(!module->named_parameters(/*recurse=*/false).contains(key) &&
                  !module->named_buffers(/*recurse=*/false).contains(key) &&
                  !module->named_children().contains(key),
              "the module has a member named '", key,
              "', a name under which the checkpoint keeps its own data; rename it");
  }

  const std::string dir = directory_of(path);
  remove_leftovers(path, /*pending_too=*/false);
  crash_point("begin");

  Manifest manifest;
  manifest.save_id = new_save_id();
  const std::string pending = pending_optimizer_path(path, manifest.save_id);
  const std::string tmp = c10::str(path, ".tmp.", ::getpid());
  try {
    if (optimizer != nullptr) {
      NewFile file(pending);
      torch::serialize::OutputArchive archive;
      optimizer->save(archive);
      file.save(archive);
      crash_point("optimizer-partial", &file);
      file.finish();
      manifest.has_optimizer = true;
      manifest.optimizer_bytes = file.checksum().size();
      manifest.optimizer_checksum = file.checksum().value();
      crash_point("optimizer-written");
    }
    {
      NewFile file(tmp);
      torch::serialize::OutputArchive archive;
      module->save(archive);
      archive.write(kManifestKey, c10::IValue(manifest.text()));
      if (hook_states != nullptr) {
        c10::List<at::Tensor> ranks;
        for (const std::string& bytes : hook_states->ranks) {
          ranks.push_back(at::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())},
                                        at::kByte)
                              .clone());
        }
        archive.write(kHookStateKey, c10::IValue(c10::ivalue::Tuple::create({hook_states->kind, ranks})));
      }
      file.save(archive);
      crash_point("model-partial", &file);
      file.finish();
      crash_point("model-written");
    }
  } catch (...) {
    std::remove(tmp.c_str());
    std::remove(pending.c_str());
    throw;
  }
  rename_file(tmp, path); // the commit
  sync_directory(dir);
  crash_point("committed");
  if (optimizer != nullptr) {
    rename_file(pending, optimizer_path(path));
  } else {
    // The optimizer state of an earlier save, which no longer belongs to PATH.
    std::remove(optimizer_path(path).c_str());
  }
  sync_directory(dir);
  crash_point("optimizer-renamed");
  remove_leftovers(path, /*pending_too=*/true);
}

// Every rank's hook state, on rank 0 (a collective of the model's group:
// the sizes, then the bytes padded to the largest). Empty elsewhere. A rank
// whose save_state throws sends size -1, so that every rank fails alike,
// naming it, instead of the others waiting for its bytes.
std::vector<std::string> gather_hook_states(ProcessGroup& group, const CommHookState& state,
                                            const c10::Device& device, const std::string& prefix) {
  std::string mine;
  std::string error;
  try {
    mine = state.save_state();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  const int world = group.size();
  const auto longs = at::TensorOptions(at::kLong).device(device);
  auto sizes = at::empty({world}, longs);
  group.allgather_into_tensor(sizes, at::full({1}, error.empty() ? static_cast<int64_t>(mine.size()) : -1, longs))
      ->wait();
  const auto host_sizes = sizes.cpu();
  for (int r = 0; r < world; ++r) {
    DDP_CHECK(host_sizes[r].item<int64_t>() >= 0, prefix, ": rank ", r, " could not save its ", state.kind(),
              " hook state", error.empty() ? std::string(" (see its error)") : ": " + error);
  }
  const int64_t largest = host_sizes.max().item<int64_t>();
  auto input = at::zeros({largest}, at::kByte);
  std::memcpy(input.data_ptr(), mine.data(), mine.size());
  std::vector<at::Tensor> outputs;
  if (group.rank() == 0) {
    for (int r = 0; r < world; ++r) {
      outputs.push_back(at::empty({largest}, at::TensorOptions(at::kByte).device(device)));
    }
  }
  GatherOptions options;
  options.root_rank = 0;
  group.gather(outputs, input.to(device), options)->wait();
  std::vector<std::string> gathered;
  for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
    const auto host = outputs[r].cpu();
    gathered.emplace_back(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()),
                          static_cast<size_t>(host_sizes[r].item<int64_t>()));
  }
  return gathered;
}

void save(const DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
          const std::string& path) {
  ProcessGroup& group = *model->process_group();
  const std::string prefix = who(group, "save_checkpoint");
  internal::CollectiveLabel label("save_checkpoint");
  if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizerBase*>(optimizer)) {
    // Sharded state: every rank sends its shard to rank 0, which writes it
    // in the format of a plain optimizer over all the parameters.
    DDP_CHECK(zero->process_group() == model->process_group(), prefix,
              ": the ZeroRedundancyOptimizer shards its state over another process group than "
              "the model's; build both over the same group (or call consolidate_state_dict and "
              "torch::save yourself)");
    zero->consolidate_state_dict(0);
  }
  std::optional<HookStates> hook_states;
  if (const auto state = model->comm_hook_state()) {
    hook_states = HookStates{state->kind(), gather_hook_states(group, *state, model->device(), prefix)};
  }
  std::string error;
  if (group.rank() == 0) {
    try {
      write_checkpoint(model, optimizer, hook_states ? &*hook_states : nullptr, path);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = error_message(e);
    }
  }
  // Every rank learns whether rank 0 succeeded, then all meet at a barrier so
  // that nobody reads the file before it is complete.
  auto failed = at::full({1}, error.empty() ? 0 : 1,
                         at::TensorOptions(at::kInt).device(model->device()));
  group.broadcast(failed, {0})->wait();
  group.barrier()->wait();
  DDP_CHECK(failed.cpu().item<int>() == 0, prefix, ": rank 0 could not write '", path, "'",
            error.empty() ? std::string(" (see rank 0's error)") : ": " + error);
}

// ---- Load ---------------------------------------------------------------------------

// Copies the archive's values into `module`'s tensors, recursively. A copy
// keeps each parameter's identity and gradient accumulator, where
// torch::load would set_() a new storage into it (as PyTorch's
// load_state_dict copies too).
void copy_from_archive(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value);
    item.value().copy_(value);
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    at::Tensor value;
    archive.read(item.key(), value, /*is_buffer=*/true);
    item.value().copy_(value);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    copy_from_archive(*child.value(), child_archive);
  }
}

// The optimizer file that `manifest` names: PATH.optimizer, or the pending
// file of a save killed between its commit and the rename (see the narrative
// at the top). Throws c10::Error saying what was expected and what was found.
std::string matching_optimizer_file(const std::string& prefix, const std::string& path,
                                    const Manifest& manifest) {
  DDP_CHECK(manifest.has_optimizer, prefix, ": '", path,
            "' holds no optimizer state (it was saved by save_checkpoint(model, path)); expected "
            "one saved by save_checkpoint(model, optimizer, path), or call "
            "load_checkpoint(model, path)");
  const std::string usual = optimizer_path(path);
  std::optional<Checksum> found_usual;
  for (const std::string& candidate : {usual, pending_optimizer_path(path, manifest.save_id)}) {
    std::optional<Checksum> found;
    try {
      found = checksum_of_file(candidate);
    } catch (const std::exception& e) {
      DDP_CHECK(false, prefix, ": ", error_message(e));
    }
    if (found && found->size() == manifest.optimizer_bytes &&
        found->value() == manifest.optimizer_checksum) {
      return candidate;
    }
    if (candidate == usual) {
      found_usual = found;
    }
  }
  DDP_CHECK(found_usual.has_value(), prefix, ": the optimizer state of '", path,
            "' is missing: expected '", usual, "' (", manifest.optimizer_text(),
            ", written by the same save), found no such file");
  DDP_CHECK(false, prefix, ": '", usual, "' does not belong to '", path,
            "': expected the optimizer state written by the same save (",
            manifest.optimizer_text(), "), found ", found_usual->size(), " bytes, checksum ",
            hex64(found_usual->value()),
            " (a file from another save, or a damaged one); the model and optimizer files must "
            "come from one save_checkpoint call");
  return usual; // not reached
}

// Hands the model's hook state what the checkpoint holds for it, or warns
// (rank 0) when one of the two is missing.
void load_hook_state(DistributedDataParallel& model, torch::serialize::InputArchive& archive,
                     const std::string& prefix, const std::string& path) {
  ProcessGroup& group = *model->process_group();
  const auto state = model->comm_hook_state();
  c10::IValue saved;
  const bool has_saved = archive.try_read(kHookStateKey, saved);
  if (!state || !has_saved) {
    if (group.rank() == 0 && (state || has_saved)) {
      internal::log_warning(
          state ? c10::str(prefix, ": '", path, "' holds no communication hook state: the model's ", state->kind(),
                           " hook starts afresh (the checkpoint was saved without that hook, or by an older ddp)")
                : c10::str(prefix, ": '", path,
                           "' holds a communication hook's state, and the model has no hook with a state: it is "
                           "ignored (register the hook, e.g. comm_hooks::powerSGD, before load_checkpoint)"));
    }
    return;
  }
  DDP_CHECK(saved.isTuple() && saved.toTupleRef().elements().size() == 2 &&
                saved.toTupleRef().elements()[0].isString() && saved.toTupleRef().elements()[1].isTensorList(),
            prefix, ": cannot load '", path, "': its '", kHookStateKey, "' entry is malformed");
  const auto& fields = saved.toTupleRef().elements();
  const std::string& kind = fields[0].toStringRef();
  DDP_CHECK(kind == state->kind(), prefix, ": '", path, "' holds the state of a ", kind,
            " hook, and the model's hook is ", state->kind(), "; register the hook it was saved with");
  std::vector<std::string> ranks;
  for (const at::Tensor& t : fields[1].toTensorList().vec()) {
    DDP_CHECK(t.scalar_type() == at::kByte && t.dim() == 1, prefix, ": cannot load '", path,
              "': a rank's hook state is not a byte tensor");
    const auto host = t.cpu().contiguous();
    ranks.emplace_back(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(host.numel()));
  }
  state->load_state(ranks, group.rank(), group.size());
}

void load(DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
          const std::string& path) {
  ProcessGroup& group = *model->process_group();
  const std::string prefix = who(group, "load_checkpoint");
  const c10::Device device = model->device();
  std::string reading = path; // the file being read, for the error message
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    std::optional<Manifest> manifest;
    c10::IValue manifest_value;
    if (archive.try_read(kManifestKey, manifest_value)) {
      try {
        if (!manifest_value.isString()) {
          throw std::runtime_error(c10::str("its '", kManifestKey, "' entry is a ",
                                            manifest_value.tagKind(), ", not a manifest"));
        }
        manifest = Manifest::parse(manifest_value.toStringRef());
      } catch (const std::runtime_error& e) {
        DDP_CHECK(false, prefix, ": cannot load '", path, "': ", e.what());
      }
    }
    // The optimizer state is checked and read before the model is touched,
    // so that a refused pair leaves the model as it was. Without a manifest
    // (an older ddp wrote the file) the pair cannot be checked.
    torch::serialize::InputArchive optimizer_archive;
    std::string optimizer_file;
    if (optimizer != nullptr) {
      optimizer_file =
          manifest ? matching_optimizer_file(prefix, path, *manifest) : optimizer_path(path);
      reading = optimizer_file;
      optimizer_archive.load_from(optimizer_file, device);
      reading = path;
    }
    load_hook_state(model, archive, prefix, path);
    copy_from_archive(*model->module(), archive);
    if (optimizer != nullptr) {
      reading = optimizer_file;
      optimizer->load(optimizer_archive);
    }
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.rfind(prefix, 0) == 0) {
      throw; // ours, complete already
    }
    DDP_CHECK(false, prefix, ": cannot load '", reading, "' onto ", device, ": ", what);
  } catch (const std::exception& e) {
    DDP_CHECK(false, prefix, ": cannot load '", reading, "' onto ", device, ": ", error_message(e));
  }
}

} // namespace

void save_checkpoint(const DistributedDataParallel& model, const std::string& path) {
  save(model, nullptr, path);
}

void save_checkpoint(const DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                     const std::string& path) {
  save(model, &optimizer, path);
}

void load_checkpoint(DistributedDataParallel& model, const std::string& path) {
  load(model, nullptr, path);
}

void load_checkpoint(DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                     const std::string& path) {
  load(model, &optimizer, path);
}

} // namespace ddp
