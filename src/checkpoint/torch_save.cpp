#include "checkpoint/torch_save.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <caffe2/serialize/inline_container.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <vector>

#include "internal/torch_compat.h"
#include "nn/checkpoint_files.h"

namespace ddp::checkpoint {

using pickle::Value;
using pickle::ValuePtr;

namespace {

struct DtypeName {
  at::ScalarType dtype;
  const char* python; // torch.<python>
};

// The dtypes a state dict holds, with Python's names for them.
const std::vector<DtypeName>& dtype_names() {
  static const std::vector<DtypeName> names = {
      {at::kFloat, "float32"},          {at::kDouble, "float64"},
      {at::kHalf, "float16"},           {at::kBFloat16, "bfloat16"},
      {at::kLong, "int64"},             {at::kInt, "int32"},
      {at::kShort, "int16"},            {at::kChar, "int8"},
      {at::kByte, "uint8"},             {at::kBool, "bool"},
      {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
#if DDP_TORCH_HAS_FLOAT8
      {at::ScalarType::Float8_e4m3fn, "float8_e4m3fn"},
      {at::ScalarType::Float8_e5m2, "float8_e5m2"},
#endif
  };
  return names;
}

// torch.FloatStorage, torch.BFloat16Storage, ...: c10's name of the dtype.
std::string storage_type_name(at::ScalarType dtype) {
  return std::string(c10::toString(dtype)) + "Storage";
}

c10::optional<at::ScalarType> dtype_of_storage_type(const std::string& name) {
  if (name == "UntypedStorage") {
    return at::kByte;
  }
  for (const auto& entry : dtype_names()) {
    if (storage_type_name(entry.dtype) == name) {
      return entry.dtype;
    }
  }
  return c10::nullopt;
}

std::vector<int64_t> int_tuple(const Value& value, const std::string& what, const char* field) {
  if (!value.is(Value::Kind::kTuple) && !value.is(Value::Kind::kList)) {
    throw std::runtime_error(what + ": a tensor's " + field + " is " + value.describe() + ", expected a tuple of ints");
  }
  std::vector<int64_t> out;
  for (const auto& item : value.items) {
    if (!item->is(Value::Kind::kInt)) {
      throw std::runtime_error(what + ": a tensor's " + field + " holds " + item->describe());
    }
    out.push_back(item->integer);
  }
  return out;
}

// The tensor of a `_rebuild_tensor_v2(storage, offset, size, stride, ...)`
// call, after checking that it lies within its storage.
ValuePtr rebuild_tensor(const std::vector<ValuePtr>& args, const std::string& what) {
  if (args.size() < 4 || !args[0]->is(Value::Kind::kTensor) || !args[1]->is(Value::Kind::kInt)) {
    throw std::runtime_error(what + ": a tensor is not rebuilt from (storage, offset, size, stride)");
  }
  const at::Tensor& storage = args[0]->tensor;
  const int64_t offset = args[1]->integer;
  const auto size = int_tuple(*args[2], what, "size");
  const auto stride = int_tuple(*args[3], what, "stride");
  if (size.size() != stride.size()) {
    throw std::runtime_error(c10::str(what, ": a tensor has ", size.size(), " sizes and ", stride.size(), " strides"));
  }
  bool empty = false;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] < 0 || stride[d] < 0) {
      throw std::runtime_error(what + ": a tensor has a negative size or stride");
    }
    empty = empty || size[d] == 0;
  }
  int64_t last = offset; // the last element's index in the storage
  for (size_t d = 0; d < size.size() && !empty; ++d) {
    if (stride[d] > 0 && (size[d] - 1) > (INT64_MAX - last) / stride[d]) {
      throw std::runtime_error(what + ": a tensor's extent overflows");
    }
    last += (size[d] - 1) * stride[d];
  }
  if (offset < 0 || (!empty && last >= storage.numel())) {
    throw std::runtime_error(c10::str(what, ": a tensor of size ", c10::IntArrayRef(size), " at offset ", offset,
                                      " does not fit in its storage of ", storage.numel(), " elements"));
  }
  return pickle::tensor(storage.as_strided(size, stride, offset));
}

} // namespace

std::string python_dtype_name(at::ScalarType dtype) {
  for (const auto& entry : dtype_names()) {
    if (entry.dtype == dtype) {
      return entry.python;
    }
  }
  throw std::runtime_error(c10::str("dtype ", dtype, " has no PyTorch name ddp knows"));
}

c10::optional<at::ScalarType> dtype_of_python_name(const std::string& name) {
  for (const auto& entry : dtype_names()) {
    if (name == entry.python) {
      return entry.dtype;
    }
  }
  return c10::nullopt;
}

// ---- Writing ------------------------------------------------------------------

void write_torch_archive(const Value& value, const ArchiveWriter& writer) {
  std::vector<at::Tensor> storages;
  pickle::Writer pickler([&](const at::Tensor& tensor) {
    const std::string key = std::to_string(storages.size());
    storages.push_back(tensor);
    std::string location = tensor.device().str();
    const auto dtype = tensor.scalar_type();
    std::vector<ValuePtr> size(static_cast<size_t>(tensor.dim())), stride(size.size());
    int64_t step = 1; // contiguous strides
    for (int64_t d = tensor.dim() - 1; d >= 0; --d) {
      size[static_cast<size_t>(d)] = pickle::integer(tensor.size(d));
      stride[static_cast<size_t>(d)] = pickle::integer(step);
      step *= std::max<int64_t>(tensor.size(d), 1);
    }
    auto id = pickle::tuple({pickle::string("storage"), pickle::global("torch", storage_type_name(dtype)),
                             pickle::string(key), pickle::string(location), pickle::integer(tensor.numel())});
    return pickle::call(pickle::global("torch._utils", "_rebuild_tensor_v2"),
                        {pickle::persistent_id(id), pickle::integer(0), pickle::tuple(size), pickle::tuple(stride),
                         pickle::boolean(false), pickle::dict({}, true)});
  });
  const std::string data = pickler.write(value);

  caffe2::serialize::PyTorchStreamWriter archive(writer);
  archive.writeRecord("data.pkl", data.data(), data.size());
  archive.writeRecord("byteorder", "little", 6);
  for (size_t i = 0; i < storages.size(); ++i) {
    // One storage's CPU copy at a time.
    const at::Tensor bytes = storages[i].to(at::kCPU).contiguous();
    archive.writeRecord("data/" + std::to_string(i), bytes.data_ptr(), bytes.numel() * bytes.element_size());
  }
  archive.writeEndOfFile();
}

void save_torch_file(const Value& value, const std::string& path) {
  const std::string tmp = c10::str(path, ".tmp.", ::getpid());
  try {
    internal::NewFile file(tmp);
    try {
      write_torch_archive(value, [&](const void* data, size_t size) { return file.write(data, size); });
    } catch (const c10::Error&) {
      // The zip writer's message says only that a write failed: name the file.
      throw std::runtime_error(c10::str("cannot write '", tmp, "' (is the disk full?)"));
    }
    file.finish();
    internal::rename_file(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  internal::sync_directory(internal::directory_of(path));
}

// ---- Reading ------------------------------------------------------------------

FileRange::FileRange(const std::string& path, int64_t offset, int64_t length) : path_(path), offset_(offset) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw std::runtime_error(c10::str("cannot open '", path, "': ", internal::errno_text(errno)));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    throw std::runtime_error(c10::str("cannot stat '", path, "': ", internal::errno_text(error)));
  }
  length_ = length < 0 ? st.st_size - offset : length;
  if (offset < 0 || length_ < 0 || offset + length_ > st.st_size) {
    ::close(fd_);
    throw std::runtime_error(c10::str("'", path, "' has ", st.st_size, " bytes, too few for bytes ", offset, " to ",
                                      offset + length_, " (truncated?)"));
  }
}

FileRange::~FileRange() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

size_t FileRange::read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const {
  if (pos >= static_cast<uint64_t>(length_)) {
    return 0;
  }
  n = std::min<uint64_t>(n, static_cast<uint64_t>(length_) - pos);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, static_cast<char*>(buf) + done, n - done,
                                static_cast<off_t>(offset_ + static_cast<int64_t>(pos + done)));
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      break;
    }
    done += static_cast<size_t>(got);
  }
  return done;
}

ValuePtr read_torch_archive(std::shared_ptr<caffe2::serialize::ReadAdapterInterface> input, const std::string& what) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(std::move(input));
  } catch (const c10::Error& e) {
    throw std::runtime_error(c10::str(what, " is not a torch.save file (", e.what_without_backtrace(),
                                      "): truncated, damaged, or written by something else"));
  }
  auto record = [&](const std::string& name) {
    try {
      return archive->getRecord(name);
    } catch (const c10::Error& e) {
      throw std::runtime_error(c10::str(what, ": cannot read its record '", name, "' (", e.what_without_backtrace(),
                                        "): truncated or damaged"));
    }
  };
  if (archive->hasRecord("constants.pkl")) {
    throw std::runtime_error(what + " is a TorchScript archive (torch::save of a module, or torch.jit.save), "
                                    "not a torch.save file of a state dict");
  }
  if (!archive->hasRecord("data.pkl")) {
    throw std::runtime_error(what + " has no data.pkl: a TorchScript archive or another zip file, not torch.save's");
  }
  if (archive->hasRecord("byteorder")) {
    auto [order, n] = record("byteorder");
    if (std::string(static_cast<const char*>(order.get()), n) != "little") {
      throw std::runtime_error(what + " holds big-endian tensors; ddp reads little-endian ones");
    }
  }

  std::map<std::string, at::Tensor> storages;
  pickle::Reader::Options options;
  options.persistent_load = [&](const Value& id) -> ValuePtr {
    if (!id.is(Value::Kind::kTuple) || id.items.size() != 5 || !id.items[0]->is(Value::Kind::kString) ||
        id.items[0]->text != "storage" || !id.items[1]->is(Value::Kind::kGlobal) ||
        !id.items[2]->is(Value::Kind::kString) || !id.items[4]->is(Value::Kind::kInt)) {
      throw std::runtime_error(what + ": a persistent id that is not a tensor storage (" + id.describe() + ")");
    }
    const auto dtype = dtype_of_storage_type(id.items[1]->name);
    if (!dtype) {
      throw std::runtime_error(what + ": storage type torch." + id.items[1]->name + " is not one ddp reads");
    }
    const std::string& key = id.items[2]->text;
    const int64_t numel = id.items[4]->integer;
    auto found = storages.find(key);
    if (found == storages.end()) {
      auto [data, nbytes] = record("data/" + key);
      const int64_t element = static_cast<int64_t>(c10::elementSize(*dtype));
      if (numel < 0 || static_cast<int64_t>(nbytes) != numel * element) {
        throw std::runtime_error(c10::str(what, ": storage '", key, "' has ", nbytes, " bytes, expected ", numel,
                                          " elements of ", element, " bytes"));
      }
      c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes), std::move(data),
                           /*allocator=*/nullptr, /*resizable=*/false);
      at::Tensor flat = at::empty({0}, at::TensorOptions().dtype(*dtype));
      flat.set_(storage, 0, {numel}, {1});
      found = storages.emplace(key, flat).first;
    } else if (found->second.scalar_type() != *dtype) {
      throw std::runtime_error(what + ": storage '" + key + "' is read with two dtypes");
    }
    return pickle::tensor(found->second);
  };
  options.on_call = [&](const Value& callable, const std::vector<ValuePtr>& args) -> ValuePtr {
    if (callable.is_global("torch._utils", "_rebuild_tensor_v2") || callable.is_global("torch._utils", "_rebuild_tensor")) {
      return rebuild_tensor(args, what);
    }
    if (callable.is_global("torch._utils", "_rebuild_parameter") ||
        callable.is_global("torch._utils", "_rebuild_parameter_with_state")) {
      if (args.empty() || !args[0]->is(Value::Kind::kTensor)) {
        throw std::runtime_error(what + ": a parameter without its tensor");
      }
      return args[0];
    }
    return nullptr;
  };
  auto [data, size] = record("data.pkl");
  pickle::Reader reader(static_cast<const char*>(data.get()), size, what + " data.pkl", std::move(options));
  return reader.read();
}

ValuePtr load_torch_file(const std::string& path) {
  return read_torch_archive(std::make_shared<FileRange>(path), "'" + path + "'");
}

} // namespace ddp::checkpoint
