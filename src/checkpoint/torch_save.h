#pragma once

// torch.save's file format, both ways (private header).
//
// A torch.save file is a zip archive (stored, not compressed, each record's
// data aligned to 64 bytes) holding `data.pkl`, a protocol-2 pickle of the
// object, and one record `data/<key>` per tensor storage. In the pickle a
// tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
// requires_grad, backward_hooks)`, the storage a persistent id
// `('storage', torch.<Type>Storage, '<key>', '<location>', numel)`. The zip
// layer is LibTorch's own (caffe2::serialize::PyTorchStreamWriter/Reader),
// which writes what Python's torch.save writes and reads what it reads.
//
// Written here: every tensor as a storage of its own, contiguous, at offset
// 0 (what torch.save makes of a state dict whose tensors share nothing),
// its location the device it is on ("cpu", "cuda:0"), as torch.save writes;
// Python's torch.load puts it back there unless given map_location. Read:
// any storage key, offset and strides within the storage (checked), views
// sharing a storage, nn.Parameter, any location (loaded onto the CPU).

#include <caffe2/serialize/read_adapter_interface.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/pickle.h"

namespace ddp::checkpoint {

using ArchiveWriter = std::function<size_t(const void*, size_t)>;

// Writes `value` (kTensor leaves allowed) as a torch.save archive through
// `writer`. Throws std::runtime_error when the writer fails.
void write_torch_archive(const pickle::Value& value, const ArchiveWriter& writer);

// Reads the torch.save archive that `input` holds; tensors come back on the
// CPU. `what` names it in errors ("'model.pt'", "chunk 3 of '__0_0.distcp'").
// Throws std::runtime_error naming `what` and what is wrong.
pickle::ValuePtr read_torch_archive(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> input,
                                    const std::string& what);

// A byte range of a file, read with pread(2); the file stays open while the
// adapter lives. Throws std::runtime_error naming the file when it cannot
// be opened, or when the range lies beyond its end.
class FileRange : public caffe2::serialize::ReadAdapterInterface {
 public:
  // The whole file when `length` is -1.
  FileRange(const std::string& path, int64_t offset = 0, int64_t length = -1);
  ~FileRange() override;
  size_t size() const override { return static_cast<size_t>(length_); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what = "") const override;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t offset_ = 0;
  int64_t length_ = 0;
};

// The file at `path` as a torch.save archive, written atomically (a
// temporary name, fsync, rename): a crash leaves the old file or the new
// one. Throws std::runtime_error naming the file.
void save_torch_file(const pickle::Value& value, const std::string& path);

// torch.load(path, map_location="cpu").
pickle::ValuePtr load_torch_file(const std::string& path);

// Python's name of a dtype ("float32", "bfloat16"); throws for a dtype
// Python has no name for.
std::string python_dtype_name(at::ScalarType dtype);
// The dtype of a Python name ("float32"), or nullopt.
c10::optional<at::ScalarType> dtype_of_python_name(const std::string& name);

} // namespace ddp::checkpoint
