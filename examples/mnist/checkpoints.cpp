// mnist_train's checkpoints (checkpoints.h).
//
// Note [Checkpoint directory]
// After epoch N the directory holds epoch N's checkpoint and `latest`,
// which says "completed_epochs N", the format, and how the run was set up.
// With --checkpoint-every K there is also one every K steps within an
// epoch: after step S of epoch N+1 its files are named epoch-(N+1)-step-S
// instead of epoch-N, `latest` says "completed_steps S" too, and
// epoch-(N+1)-step-S.sampler.pt holds the sampler's epoch and position, from
// which a resumed run draws the same remaining batches as an uninterrupted
// one. The checkpoint, by --checkpoint-format:
//   ddp          epoch-N.pt (ddp::save_checkpoint; its optimizer state in
//                epoch-N.pt.optimizer; under --fsdp a sharded checkpoint,
//                epoch-N.pt and a file per rank)
//   dcp          epoch-N.dcp/, a torch.distributed.checkpoint directory:
//                model and optimizer, loadable at any world size, by DDP,
//                ZeRO and FSDP alike, and by PyTorch's dcp.load
//   torch        epoch-N.model.pt and epoch-N.optim.pt, what PyTorch's
//                torch.save(model.state_dict()) and
//                torch.save(optimizer.state_dict()) write
//   safetensors  epoch-N.safetensors (the model) and epoch-N.optim.pt
// `latest` is written after the checkpoint is complete, to a temporary file
// renamed over the old one, so that whenever the job is killed it names a
// complete checkpoint. Only then are older epochs' files removed.

#include "checkpoints.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mnist {

namespace {

const char* const kSidecarName = "latest";


void remove_tree(const std::string& path) {
  if (DIR* listing = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") {
        remove_tree(path + "/" + name);
      }
    }
    ::closedir(listing);
    ::rmdir(path.c_str());
  } else {
    std::remove(path.c_str());
  }
}

} // namespace

void make_directories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      throw std::runtime_error("cannot create directory " + prefix + ": " + std::strerror(errno));
    }
    if (slash == std::string::npos) {
      return;
    }
  }
}

// (Safe against a killed process; against a power cut it would also need an
// fsync.)
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      throw std::runtime_error("cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

void write_sidecar(const std::string& dir, const Sidecar& s) {
  std::ostringstream text;
  text << "# mnist_train: the newest complete checkpoint is " << checkpoint_tag(s.completed_epochs, s.completed_steps)
       << "\n"
       << "completed_epochs " << s.completed_epochs << "\n"
       << "completed_steps " << s.completed_steps << "\n"
       << "world_size " << s.world_size << "\n"
       << "batch_size " << s.batch_size << "\n"
       << "seed " << s.seed << "\n"
       << "format " << s.format << "\n";
  write_atomically(dir + "/" + kSidecarName, text.str());
}

std::optional<Sidecar> read_sidecar(const std::string& dir) {
  const std::string path = dir + "/" + kSidecarName;
  std::ifstream in(path);
  if (!in) {
    return std::nullopt;
  }
  Sidecar s;
  std::string line;
  bool has_epochs = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "format") {
      fields >> s.format;
      continue;
    }
    long long value = -1;
    if (!(fields >> value) || value < 0) {
      throw std::runtime_error(path + " line " + std::to_string(number) + ": cannot read '" +
                               line + "' (expected a name and a number)");
    }
    if (key == "completed_epochs") {
      s.completed_epochs = value;
      has_epochs = true;
    } else if (key == "completed_steps") {
      s.completed_steps = value;
    } else if (key == "world_size") {
      s.world_size = value;
    } else if (key == "batch_size") {
      s.batch_size = value;
    } else if (key == "seed") {
      s.seed = static_cast<uint64_t>(value);
    }
  }
  if (!has_epochs) {
    throw std::runtime_error(path + ": no 'completed_epochs' line");
  }
  return s;
}

std::string checkpoint_tag(int64_t completed_epochs, int64_t completed_steps) {
  return completed_steps == 0
             ? "epoch-" + std::to_string(completed_epochs)
             : "epoch-" + std::to_string(completed_epochs + 1) + "-step-" + std::to_string(completed_steps);
}

void save_sampler(const ddp::DistributedSampler& sampler, const std::string& dir, const std::string& tag) {
  torch::serialize::OutputArchive archive;
  sampler.save(archive);
  const std::string path = dir + "/" + tag + ".sampler.pt";
  archive.save_to(path + ".tmp");
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + path + ".tmp to " + path + ": " + std::strerror(errno));
  }
}

void load_sampler(ddp::DistributedSampler& sampler, const std::string& dir, const std::string& tag) {
  torch::serialize::InputArchive archive;
  archive.load_from(dir + "/" + tag + ".sampler.pt");
  sampler.load(archive);
}

std::string save_checkpoint(const Trained& t, const std::string& dir, const std::string& format,
                            const std::string& tag) {
  const std::string base = dir + "/" + tag;
  auto& optimizer = *t.optimizer;
  if (format == "dcp") {
    const std::string path = base + ".dcp";
    if (t.fsdp_model != nullptr) {
      ddp::dcp::save(*t.fsdp_model, optimizer, path);
    } else {
      ddp::dcp::save(*t.ddp_model, optimizer, path);
    }
    return path;
  }
  if (format == "torch" || format == "safetensors") {
    const std::string model_path = base + (format == "torch" ? ".model.pt" : ".safetensors");
    const std::string optim_path = base + ".optim.pt";
    if (format == "torch") {
      if (t.fsdp_model != nullptr) {
        ddp::save_torch_checkpoint(*t.fsdp_model, &optimizer, model_path, optim_path);
      } else {
        ddp::save_torch_checkpoint(*t.ddp_model, &optimizer, model_path, optim_path);
      }
      return model_path;
    }
    // safetensors holds the model's tensors; the optimizer's state goes
    // beside it in torch.save's format (torch_format.h). Gathered on rank 0.
    const auto& group = t.fsdp_model != nullptr ? (*t.fsdp_model)->shard_group() : (*t.ddp_model)->process_group();
    ddp::StateDict state;
    ddp::OptimizerStateDict optimizer_state;
    const auto full = ddp::FullStateDictOptions().rank0_only(true).offload_to_cpu(true);
    if (t.fsdp_model != nullptr) {
      state = (*t.fsdp_model)->full_state_dict(full);
      optimizer_state = ddp::full_optimizer_state_dict(*t.fsdp_model, optimizer, full);
    } else {
      if (auto* zero = dynamic_cast<ddp::optim::ZeroRedundancyOptimizerBase*>(&optimizer)) {
        zero->consolidate_state_dict(0);
      }
      if (group->rank() == 0) {
        state = ddp::module_state_dict(*(*t.ddp_model)->module());
        optimizer_state = ddp::optimizer_state_dict(optimizer);
      }
    }
    if (group->rank() == 0) {
      ddp::save_safetensors(state, model_path);
      ddp::save_torch_optimizer_state_dict(optimizer_state, optim_path);
    }
    group->barrier()->wait(); // nobody reads before rank 0 has written
    return model_path;
  }
  const std::string path = base + ".pt";
  if (t.fsdp_model != nullptr) {
    ddp::save_sharded_checkpoint(*t.fsdp_model, optimizer, path);
  } else {
    ddp::save_checkpoint(*t.ddp_model, optimizer, path);
  }
  return path;
}

std::string load_checkpoint(const Trained& t, const std::string& dir, const std::string& format,
                            const std::string& tag, int world_size, std::string* note) {
  const std::string base = dir + "/" + tag;
  auto& optimizer = *t.optimizer;
  if (format == "dcp") {
    // Any world size: each rank reads the pieces it holds, optimizer state too.
    const std::string path = base + ".dcp";
    if (t.fsdp_model != nullptr) {
      ddp::dcp::load(*t.fsdp_model, optimizer, path);
    } else {
      ddp::dcp::load(*t.ddp_model, optimizer, path);
    }
    return path;
  }
  if (format == "torch" || format == "safetensors") {
    const std::string model_path = base + (format == "torch" ? ".model.pt" : ".safetensors");
    const auto state = format == "torch" ? ddp::load_torch_state_dict(model_path) : ddp::load_safetensors(model_path);
    const auto optimizer_state = ddp::load_torch_optimizer_state_dict(base + ".optim.pt");
    if (t.fsdp_model != nullptr) {
      (*t.fsdp_model)->load_full_state_dict(state);
      ddp::load_full_optimizer_state_dict(*t.fsdp_model, optimizer, optimizer_state);
    } else {
      ddp::load_module_state_dict(*(*t.ddp_model)->module(), state);
      ddp::load_optimizer_state_dict(optimizer, optimizer_state);
    }
    return model_path;
  }
  const std::string path = base + ".pt";
  if (t.fsdp_model == nullptr) {
    ddp::load_checkpoint(*t.ddp_model, optimizer, path);
  } else if (ddp::sharded_checkpoint_world_size(path) == world_size) {
    ddp::load_sharded_checkpoint(*t.fsdp_model, optimizer, path); // each rank its own file
  } else {
    // Another world size: the full state, resharded; momentum starts afresh.
    (*t.fsdp_model)->load_full_state_dict(ddp::read_sharded_checkpoint_full(path));
    *note = " (another world size: the momentum starts afresh; --checkpoint-format dcp keeps it)";
  }
  return path;
}

void remove_other_checkpoints(const std::string& dir, const std::string& keep) {
  // Keeps <keep> and every file named after it (epoch-2.pt.optimizer, a
  // sharded checkpoint's rank files, epoch-2.dcp/, epoch-3-step-10.sampler.pt),
  // and removes temporary files that a killed save left behind.
  const std::string kept = keep + ".";
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    return;
  }
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.rfind("epoch-", 0) == 0 && name.rfind(kept, 0) != 0) {
      remove_tree(dir + "/" + name); // best effort
    }
  }
  ::closedir(listing);
}

} // namespace mnist
