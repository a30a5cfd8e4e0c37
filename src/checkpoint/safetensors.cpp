// safetensors files (safetensors.h).
//
// Layout: bytes 0-7 the header's length N (little-endian), bytes 8 to 8+N
// the header, JSON: {"name": {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}, padded
// with spaces to a multiple of 8; then the data, each tensor's bytes at
// [8 + N + begin, 8 + N + end), row-major, little-endian, one after the
// other with no gap (the reference reader refuses gaps and overlaps).

#include <ddp/comm/error.h>
#include <ddp/checkpoint/safetensors.h>

#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "checkpoint/torch_save.h"
#include "internal/check.h"
#include "internal/json.h"
#include "internal/torch_compat.h"
#include "nn/checkpoint_files.h"

namespace ddp {

namespace {

// Headers beyond this are refused before anything is allocated (the
// reference reader's own limit).
constexpr uint64_t kMaxHeaderBytes = 100 * 1000 * 1000;

struct DtypeCode {
  at::ScalarType dtype;
  const char* code;
};

const std::vector<DtypeCode>& dtype_codes() {
  static const std::vector<DtypeCode> codes = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"},
#if DDP_TORCH_HAS_FLOAT8
      {at::ScalarType::Float8_e4m3fn, "F8_E4M3"}, {at::ScalarType::Float8_e5m2, "F8_E5M2"},
#endif
  };
  return codes;
}

struct Entry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries; // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

// Reads and checks the header of `path`; `file_size` the file's.
Header read_header(const checkpoint::FileRange& file, const std::string& path) {
  const std::string where = "'" + path + "'";
  uint8_t length[8];
  DDP_CHECK(file.size() >= 8 && file.read(0, length, 8) == 8, where,
            " is not a safetensors file: it has fewer than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | length[i];
  }
  DDP_CHECK(n <= kMaxHeaderBytes && n <= file.size() - 8, where, " is not a safetensors file (or is truncated): its ",
            "header length says ", n, " bytes, the file has ", file.size(), " bytes in all");
  std::string text(n, '\0');
  DDP_CHECK(file.read(8, text.data(), n) == n, where, ": cannot read its header");
  json::Value root;
  try {
    root = json::parse(text);
  } catch (const std::exception& e) {
    DDP_CHECK(false, where, " is not a safetensors file: its header is not JSON (", error_message(e), ")");
  }
  DDP_CHECK(root.is(json::Value::Kind::kObject), where, ": its header is not a JSON object");
  Header header;
  header.data_start = 8 + n;
  const uint64_t data_size = file.size() - header.data_start;
  for (const auto& [name, value] : root.members) {
    if (name == "__metadata__") {
      DDP_CHECK(value.is(json::Value::Kind::kObject), where, ": __metadata__ is not an object");
      for (const auto& [k, v] : value.members) {
        DDP_CHECK(v.is(json::Value::Kind::kString), where, ": __metadata__ '", k, "' is not a string");
        header.metadata[k] = v.text;
      }
      continue;
    }
    const std::string key = where + " tensor '" + name + "'";
    DDP_CHECK(value.is(json::Value::Kind::kObject), key, ": not an object");
    Entry entry;
    entry.name = name;
    const json::Value* dtype = value.find("dtype");
    DDP_CHECK(dtype != nullptr && dtype->is(json::Value::Kind::kString), key, ": no dtype");
    bool known = false;
    for (const auto& c : dtype_codes()) {
      if (dtype->text == c.code) {
        entry.dtype = c.dtype;
        known = true;
      }
    }
    DDP_CHECK(known, key, ": dtype '", dtype->text, "' is not one ddp reads");
    auto whole = [&](const json::Value& v, const char* what) {
      DDP_CHECK(v.is(json::Value::Kind::kNumber) && v.number >= 0 && v.number <= 9007199254740992.0 &&
                    v.number == std::floor(v.number),
                key, ": ", what, " holds something other than a whole number");
      return static_cast<uint64_t>(v.number);
    };
    const json::Value* shape = value.find("shape");
    DDP_CHECK(shape != nullptr && shape->is(json::Value::Kind::kArray), key, ": no shape");
    uint64_t numel = 1;
    for (const auto& d : shape->items) {
      const uint64_t size = whole(d, "shape");
      DDP_CHECK(size == 0 || numel <= (uint64_t{1} << 62) / size, key, ": its shape is too large");
      numel *= size;
      entry.shape.push_back(static_cast<int64_t>(size));
    }
    const json::Value* offsets = value.find("data_offsets");
    DDP_CHECK(offsets != nullptr && offsets->is(json::Value::Kind::kArray) && offsets->items.size() == 2, key,
              ": no data_offsets [begin, end]");
    entry.begin = whole(offsets->items[0], "data_offsets");
    entry.end = whole(offsets->items[1], "data_offsets");
    DDP_CHECK(entry.begin <= entry.end && entry.end <= data_size, key, ": its bytes [", entry.begin, ", ", entry.end,
              ") lie beyond the file's ", data_size, " bytes of data (truncated?)");
    const uint64_t bytes = numel * c10::elementSize(entry.dtype);
    DDP_CHECK(entry.end - entry.begin == bytes, key, ": shape ", c10::IntArrayRef(entry.shape), " of ", dtype->text,
              " takes ", bytes, " bytes, its data_offsets give ", entry.end - entry.begin);
    header.entries.push_back(std::move(entry));
  }
  std::sort(header.entries.begin(), header.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t next = 0;
  for (const auto& e : header.entries) {
    DDP_CHECK(e.begin == next, where, " tensor '", e.name, "': its bytes start at ", e.begin, ", expected ", next,
              " (tensors overlap or leave a gap)");
    next = e.end;
  }
  return header;
}

} // namespace

void save_safetensors(const StateDict& state, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  json::Value root;
  root.kind = json::Value::Kind::kObject;
  uint64_t offset = 0;
  for (const auto& item : state) {
    DDP_CHECK(item.key() != "__metadata__", "save_safetensors: '", path, "': a tensor may not be named __metadata__");
    const char* code = nullptr;
    for (const auto& c : dtype_codes()) {
      code = c.dtype == item.value().scalar_type() ? c.code : code;
    }
    DDP_CHECK(code != nullptr, "save_safetensors: '", path, "' tensor '", item.key(), "': safetensors has no dtype for ",
              item.value().scalar_type());
    json::Value entry;
    entry.kind = json::Value::Kind::kObject;
    entry.members["dtype"] = json::string_value(code);
    entry.members["shape"].kind = json::Value::Kind::kArray;
    for (int64_t d : item.value().sizes()) {
      entry.members["shape"].items.push_back(json::number_value(static_cast<double>(d)));
    }
    const uint64_t bytes = static_cast<uint64_t>(item.value().numel()) * item.value().element_size();
    entry.members["data_offsets"].kind = json::Value::Kind::kArray;
    entry.members["data_offsets"].items = {json::number_value(static_cast<double>(offset)),
                                           json::number_value(static_cast<double>(offset + bytes))};
    root.members[item.key()] = std::move(entry);
    offset += bytes;
  }
  json::Value& meta = root.members["__metadata__"];
  meta.kind = json::Value::Kind::kObject;
  for (const auto& [k, v] : metadata.empty() ? std::map<std::string, std::string>{{"format", "pt"}} : metadata) {
    meta.members[k] = json::string_value(v);
  }
  std::string header;
  json::write(root, header);
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = c10::str(path, ".tmp.", ::getpid());
  try {
    internal::NewFile file(tmp);
    auto write = [&](const void* data, size_t size) {
      if (size > 0 && file.write(data, size) != size) {
        throw std::runtime_error(c10::str("cannot write '", tmp, "' (is the disk full?)"));
      }
    };
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) {
      length[i] = static_cast<uint8_t>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
    }
    write(length, 8);
    write(header.data(), header.size());
    for (const auto& item : state) {
      const at::Tensor bytes = item.value().detach().to(at::kCPU).contiguous(); // one at a time
      write(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size());
    }
    file.finish();
    internal::rename_file(tmp, path);
  } catch (const c10::Error&) {
    std::remove(tmp.c_str());
    throw;
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    DDP_CHECK(false, "save_safetensors: ", error_message(e));
  }
  internal::sync_directory(internal::directory_of(path));
}

StateDict load_safetensors(const std::string& path) {
  std::unique_ptr<checkpoint::FileRange> file;
  try {
    file = std::make_unique<checkpoint::FileRange>(path);
  } catch (const std::exception& e) {
    DDP_CHECK(false, "load_safetensors: ", error_message(e));
  }
  const Header header = read_header(*file, path);
  StateDict state;
  for (const auto& e : header.entries) {
    auto tensor = at::empty(e.shape, at::TensorOptions(e.dtype));
    const uint64_t bytes = e.end - e.begin;
    DDP_CHECK(file->read(header.data_start + e.begin, tensor.data_ptr(), bytes) == bytes, "'", path, "' tensor '",
              e.name, "': cannot read its bytes");
    state.insert(e.name, tensor);
  }
  return state;
}

std::map<std::string, std::string> safetensors_metadata(const std::string& path) {
  std::unique_ptr<checkpoint::FileRange> file;
  try {
    file = std::make_unique<checkpoint::FileRange>(path);
  } catch (const std::exception& e) {
    DDP_CHECK(false, "safetensors_metadata: ", error_message(e));
  }
  return read_header(*file, path).metadata;
}

} // namespace ddp
