#pragma once

// Python's pickle, the part of it that PyTorch's files use (private header).
//
// torch.save writes a zip archive whose `data.pkl` is a pickle (protocol 2)
// of the saved object, with each tensor's bytes in a record of its own that
// the pickle names through a persistent id; torch.distributed.checkpoint's
// `.metadata` is a pickle (protocol 4) of dataclasses. LibTorch's own
// pickler tags dictionaries with TorchScript types and its unpickler drops
// `collections.OrderedDict`, so neither reads nor writes what Python does:
// this is the small pickler both directions need.
//
// A pickle is read into a tree of `Value`s without running anything: a
// global is only its name, a call (REDUCE, NEWOBJ) is recorded as a
// `kCall` of the callable and its arguments, and BUILD attaches the state.
// The caller interprets the tree: `torch_save.cpp` turns
// `torch._utils._rebuild_tensor_v2` calls into tensors as they are read
// (Reader::Options::on_call), `dcp/metadata.cpp` reads the dataclasses.
// Bad input (truncated, an unknown opcode, a stack that does not add up,
// too deep) throws std::runtime_error naming the offset; it never crashes.
//
// Thread-safety: none needed; values are built and read by one thread.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::checkpoint::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,   // `ordered`: a collections.OrderedDict
    kGlobal, // module.name, not resolved
    kCall,   // callable(args...) or callable.__new__(callable, args...), state set by BUILD
    kTensor, // made by the caller (persistent ids, _rebuild_tensor_v2)
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string text;                                 // kString, kBytes; kGlobal: the module
  std::string name;                                 // kGlobal: the name in the module
  std::vector<ValuePtr> items;                      // kTuple, kList; kCall: the arguments
  std::vector<std::pair<ValuePtr, ValuePtr>> entries; // kDict, in insertion order
  bool ordered = false;                             // kDict: an OrderedDict
  ValuePtr callable;                                // kCall
  bool newobj = false;                              // kCall made by NEWOBJ
  ValuePtr state;                                   // kCall: BUILD's argument, or null
  at::Tensor tensor;                                // kTensor

  bool is(Kind k) const { return kind == k; }
  // kGlobal (or a kCall of one) named `module`.`name`.
  bool is_global(const char* module, const char* name) const;
  // The value of `key` in a kDict with string keys, or nullptr.
  const Value* get(const std::string& key) const;
  // A short description for error messages: "str 'lr'", "int 3", "tuple of 2".
  std::string describe() const;
};

ValuePtr none();
ValuePtr boolean(bool value);
ValuePtr integer(int64_t value);
ValuePtr number(double value);
ValuePtr string(std::string value);
ValuePtr tuple(std::vector<ValuePtr> items);
ValuePtr list(std::vector<ValuePtr> items);
ValuePtr dict(std::vector<std::pair<ValuePtr, ValuePtr>> entries, bool ordered = false);
ValuePtr global(std::string module, std::string name);
ValuePtr call(ValuePtr callable, std::vector<ValuePtr> args);
// cls.__new__(cls) then BUILD(state): how pickle stores a dataclass.
ValuePtr object(ValuePtr cls, ValuePtr state);
ValuePtr tensor(at::Tensor value);

// Writes `value` as a protocol-2 pickle, as torch.save writes data.pkl.
// A kTensor is handed to `persistent_tensor`, which returns what stands for
// it in the pickle (torch.save's `_rebuild_tensor_v2(...)` call with a
// persistent id, see torch_save.cpp); a kCall whose `callable` is the
// string "persistent_id" writes its single argument as a persistent id.
class Writer {
 public:
  using TensorHook = std::function<ValuePtr(const at::Tensor&)>;
  explicit Writer(TensorHook persistent_tensor = nullptr) : persistent_tensor_(std::move(persistent_tensor)) {}
  std::string write(const Value& value);

 private:
  void put(const Value& value, int depth);
  void put_int(int64_t value);
  void put_string(const std::string& value);
  void put_global(const std::string& module, const std::string& name);

  TensorHook persistent_tensor_;
  std::string out_;
};

// A persistent id's stand-in, for the Writer.
ValuePtr persistent_id(ValuePtr id);

// Reads a pickle of protocol 0 to 5, the opcodes that Python's pickle module
// and torch.save emit for data (no instances of protocol 0/1 classes).
class Reader {
 public:
  struct Options {
    // Called for every REDUCE and NEWOBJ with the callable and arguments;
    // returns the value standing for the call, or nullptr for a plain kCall.
    std::function<ValuePtr(const Value& callable, const std::vector<ValuePtr>& args)> on_call;
    // Called for every persistent id (BINPERSID); required when the pickle
    // holds one.
    std::function<ValuePtr(const Value& id)> persistent_load;
  };
  // `what` names the input in errors ("'model.pt' data.pkl").
  Reader(const char* data, size_t size, std::string what, Options options);
  ValuePtr read();

 private:
  [[noreturn]] void fail(const std::string& why) const;
  uint8_t byte();
  std::string bytes(uint64_t n);
  uint64_t little(int n);
  ValuePtr pop();
  std::vector<ValuePtr> pop_mark();
  ValuePtr& top();
  void push(ValuePtr value);
  void memo_put(uint64_t index);
  ValuePtr memo_get(uint64_t index);
  ValuePtr make_call(ValuePtr callable, std::vector<ValuePtr> args, bool newobj);
  void set_items(Value& dict, std::vector<ValuePtr>& kv);

  const char* data_;
  size_t size_;
  size_t at_ = 0;
  size_t op_at_ = 0;
  std::string what_;
  Options options_;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::vector<ValuePtr> memo_;
};

} // namespace ddp::checkpoint::pickle
