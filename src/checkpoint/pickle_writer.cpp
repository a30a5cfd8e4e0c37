// The Value tree and the protocol-2 writer of pickle.h.

#include "checkpoint/pickle.h"

#include <c10/util/StringUtil.h>

#include <cstring>
#include <stdexcept>

namespace ddp::checkpoint::pickle {

namespace {
// Deeper than any state dict; a bound for a tree with a cycle in it.
constexpr int kMaxDepth = 100;

ValuePtr make(Value::Kind kind) {
  auto value = std::make_shared<Value>();
  value->kind = kind;
  return value;
}
} // namespace

bool Value::is_global(const char* module, const char* global_name) const {
  if (kind == Kind::kCall && callable) {
    return callable->is_global(module, global_name);
  }
  return kind == Kind::kGlobal && text == module && name == global_name;
}

const Value* Value::get(const std::string& key) const {
  if (kind != Kind::kDict) {
    return nullptr;
  }
  for (const auto& [k, v] : entries) {
    if (k->kind == Kind::kString && k->text == key) {
      return v.get();
    }
  }
  return nullptr;
}

std::string Value::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return boolean ? "True" : "False";
    case Kind::kInt:
      return c10::str("int ", integer);
    case Kind::kFloat:
      return c10::str("float ", number);
    case Kind::kString:
      return c10::str("str '", text.size() > 40 ? text.substr(0, 40) + "..." : text, "'");
    case Kind::kBytes:
      return c10::str("bytes of length ", text.size());
    case Kind::kTuple:
      return c10::str("tuple of ", items.size());
    case Kind::kList:
      return c10::str("list of ", items.size());
    case Kind::kDict:
      return c10::str(ordered ? "OrderedDict" : "dict", " of ", entries.size());
    case Kind::kGlobal:
      return c10::str("global ", text, ".", name);
    case Kind::kCall:
      return callable && callable->kind == Kind::kGlobal
          ? c10::str("object ", callable->text, ".", callable->name)
          : std::string("object");
    case Kind::kTensor:
      return c10::str("tensor ", tensor.scalar_type(), tensor.sizes());
  }
  return "value";
}

ValuePtr none() {
  return make(Value::Kind::kNone);
}
ValuePtr boolean(bool value) {
  auto v = make(Value::Kind::kBool);
  v->boolean = value;
  return v;
}
ValuePtr integer(int64_t value) {
  auto v = make(Value::Kind::kInt);
  v->integer = value;
  return v;
}
ValuePtr number(double value) {
  auto v = make(Value::Kind::kFloat);
  v->number = value;
  return v;
}
ValuePtr string(std::string value) {
  auto v = make(Value::Kind::kString);
  v->text = std::move(value);
  return v;
}
ValuePtr tuple(std::vector<ValuePtr> items) {
  auto v = make(Value::Kind::kTuple);
  v->items = std::move(items);
  return v;
}
ValuePtr list(std::vector<ValuePtr> items) {
  auto v = make(Value::Kind::kList);
  v->items = std::move(items);
  return v;
}
ValuePtr dict(std::vector<std::pair<ValuePtr, ValuePtr>> entries, bool ordered) {
  auto v = make(Value::Kind::kDict);
  v->entries = std::move(entries);
  v->ordered = ordered;
  return v;
}
ValuePtr global(std::string module, std::string name) {
  auto v = make(Value::Kind::kGlobal);
  v->text = std::move(module);
  v->name = std::move(name);
  return v;
}
ValuePtr call(ValuePtr callable, std::vector<ValuePtr> args) {
  auto v = make(Value::Kind::kCall);
  v->callable = std::move(callable);
  v->items = std::move(args);
  return v;
}
ValuePtr object(ValuePtr cls, ValuePtr state) {
  auto v = call(std::move(cls), {});
  v->newobj = true;
  v->state = std::move(state);
  return v;
}
ValuePtr tensor(at::Tensor value) {
  auto v = make(Value::Kind::kTensor);
  v->tensor = std::move(value);
  return v;
}
ValuePtr persistent_id(ValuePtr id) {
  return call(string("persistent_id"), {std::move(id)});
}

// ---- Writer -------------------------------------------------------------------

namespace {
// The protocol-2 opcodes the writer emits.
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt2 = 'M';
constexpr char kBinInt = 'J';
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kBinUnicode = 'X';
constexpr char kEmptyTuple = ')';
constexpr char kTuple1 = '\x85';
constexpr char kTuple2 = '\x86';
constexpr char kTuple3 = '\x87';
constexpr char kTuple = 't';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kGlobal = 'c';
constexpr char kReduce = 'R';
constexpr char kNewObj = '\x81';
constexpr char kBuild = 'b';
constexpr char kBinPersId = 'Q';
// Python's pickler batches APPENDS and SETITEMS by 1000.
constexpr size_t kBatch = 1000;
} // namespace

std::string Writer::write(const Value& value) {
  out_.clear();
  out_ += kProto;
  out_ += '\x02';
  put(value, 0);
  out_ += kStop;
  return std::move(out_);
}

void Writer::put_int(int64_t value) {
  if (value >= 0 && value < 256) {
    out_ += kBinInt1;
    out_ += static_cast<char>(value);
  } else if (value >= 0 && value < 65536) {
    out_ += kBinInt2;
    out_ += static_cast<char>(value & 0xff);
    out_ += static_cast<char>(value >> 8);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_ += kBinInt;
    const auto u = static_cast<uint32_t>(static_cast<int32_t>(value));
    for (int i = 0; i < 4; ++i) {
      out_ += static_cast<char>((u >> (8 * i)) & 0xff);
    }
  } else {
    // LONG1: little-endian two's complement, 8 bytes (Python accepts any
    // length that holds the value).
    out_ += kLong1;
    out_ += '\x08';
    const auto u = static_cast<uint64_t>(value);
    for (int i = 0; i < 8; ++i) {
      out_ += static_cast<char>((u >> (8 * i)) & 0xff);
    }
  }
}

void Writer::put_string(const std::string& value) {
  out_ += kBinUnicode;
  const auto n = static_cast<uint32_t>(value.size());
  for (int i = 0; i < 4; ++i) {
    out_ += static_cast<char>((n >> (8 * i)) & 0xff);
  }
  out_ += value;
}

void Writer::put_global(const std::string& module, const std::string& name) {
  out_ += kGlobal;
  out_ += module;
  out_ += '\n';
  out_ += name;
  out_ += '\n';
}

void Writer::put(const Value& value, int depth) {
  if (depth > kMaxDepth) {
    throw std::runtime_error("pickle: the value is nested deeper than 100 levels");
  }
  switch (value.kind) {
    case Value::Kind::kNone:
      out_ += kNone;
      return;
    case Value::Kind::kBool:
      out_ += value.boolean ? kNewTrue : kNewFalse;
      return;
    case Value::Kind::kInt:
      put_int(value.integer);
      return;
    case Value::Kind::kFloat: {
      out_ += kBinFloat;
      uint64_t bits;
      std::memcpy(&bits, &value.number, sizeof bits);
      for (int i = 7; i >= 0; --i) {
        out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
      }
      return;
    }
    case Value::Kind::kString:
      put_string(value.text);
      return;
    case Value::Kind::kBytes:
      // Protocol 2 has no bytes opcode; Python writes _codecs.encode(s, 'latin1').
      put_global("_codecs", "encode");
      {
        std::string latin1;
        for (unsigned char c : value.text) {
          if (c < 0x80) {
            latin1 += static_cast<char>(c);
          } else {
            latin1 += static_cast<char>(0xc0 | (c >> 6));
            latin1 += static_cast<char>(0x80 | (c & 0x3f));
          }
        }
        put_string(latin1);
      }
      put_string("latin1");
      out_ += kTuple2;
      out_ += kReduce;
      return;
    case Value::Kind::kTuple:
      if (value.items.empty()) {
        out_ += kEmptyTuple;
        return;
      }
      if (value.items.size() > 3) {
        out_ += kMark;
      }
      for (const auto& item : value.items) {
        put(*item, depth + 1);
      }
      out_ += value.items.size() == 1 ? kTuple1 : value.items.size() == 2 ? kTuple2 : value.items.size() == 3 ? kTuple3 : kTuple;
      return;
    case Value::Kind::kList:
      out_ += kEmptyList;
      for (size_t from = 0; from < value.items.size(); from += kBatch) {
        out_ += kMark;
        for (size_t i = from; i < std::min(value.items.size(), from + kBatch); ++i) {
          put(*value.items[i], depth + 1);
        }
        out_ += kAppends;
      }
      return;
    case Value::Kind::kDict:
      if (value.ordered) {
        put_global("collections", "OrderedDict");
        out_ += kEmptyTuple;
        out_ += kReduce;
      } else {
        out_ += kEmptyDict;
      }
      for (size_t from = 0; from < value.entries.size(); from += kBatch) {
        out_ += kMark;
        for (size_t i = from; i < std::min(value.entries.size(), from + kBatch); ++i) {
          put(*value.entries[i].first, depth + 1);
          put(*value.entries[i].second, depth + 1);
        }
        out_ += kSetItems;
      }
      return;
    case Value::Kind::kGlobal:
      put_global(value.text, value.name);
      return;
    case Value::Kind::kCall:
      if (value.callable && value.callable->kind == Value::Kind::kString && value.callable->text == "persistent_id") {
        put(*value.items.at(0), depth + 1);
        out_ += kBinPersId;
        return;
      }
      if (!value.callable) {
        throw std::runtime_error("pickle: a call without a callable");
      }
      put(*value.callable, depth + 1);
      {
        Value args;
        args.kind = Value::Kind::kTuple;
        args.items = value.items;
        put(args, depth + 1);
      }
      out_ += value.newobj ? kNewObj : kReduce;
      if (value.state) {
        put(*value.state, depth + 1);
        out_ += kBuild;
      }
      return;
    case Value::Kind::kTensor:
      if (!persistent_tensor_) {
        throw std::runtime_error("pickle: a tensor where none can be written");
      }
      put(*persistent_tensor_(value.tensor), depth + 1);
      return;
  }
}

} // namespace ddp::checkpoint::pickle
