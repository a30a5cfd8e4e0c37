#include <ddp/nn/checkpoint.h>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include <unistd.h>

#include <cstdio>
#include <exception>

#include "internal/check.h"

namespace ddp {

namespace {

std::string who(const ProcessGroup& group, const char* op) {
  return c10::str("[rank ", group.rank(), "/", group.size(), "] ", op);
}

// Writes with `write(tmp)` then renames tmp to `path`: readers never see a
// partial file.
template <typename Write>
void write_atomically(const std::string& path, Write&& write) {
  const std::string tmp = c10::str(path, ".tmp.", ::getpid());
  try {
    write(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(c10::str("cannot rename ", tmp, " to ", path, ": ",
                                      std::strerror(errno)));
  }
}

void save(const DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
          const std::string& path) {
  ProcessGroup& group = *model->process_group();
  const std::string prefix = who(group, "save_checkpoint");
  std::string error;
  if (group.rank() == 0) {
    try {
      write_atomically(path, [&](const std::string& tmp) { torch::save(model->module(), tmp); });
      if (optimizer != nullptr) {
        write_atomically(path + ".optimizer",
                         [&](const std::string& tmp) { torch::save(*optimizer, tmp); });
      }
    } catch (const std::exception& e) {
      error = e.what();
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

void load(DistributedDataParallel& model, torch::optim::Optimizer* optimizer,
          const std::string& path) {
  ProcessGroup& group = *model->process_group();
  const c10::Device device = model->device();
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    copy_from_archive(*model->module(), archive);
    if (optimizer != nullptr) {
      torch::load(*optimizer, path + ".optimizer", device);
    }
  } catch (const std::exception& e) {
    DDP_CHECK(false, who(group, "load_checkpoint"), ": cannot load '", path, "' onto ", device,
              ": ", e.what());
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
