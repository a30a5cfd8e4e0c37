// The reader of pickle.h: a stack machine over the opcodes of protocols 0
// to 5 that carry data. Nothing is executed: globals stay names, calls are
// recorded (or handed to Options::on_call).

#include "checkpoint/pickle.h"

#include <c10/util/StringUtil.h>

#include <cstring>
#include <stdexcept>

namespace ddp::checkpoint::pickle {

namespace {
// Bounds for bad input: a memo index far beyond what a writer numbers, and
// a stack deeper than any real pickle needs.
constexpr uint64_t kMaxMemo = uint64_t{1} << 24;
constexpr size_t kMaxStack = size_t{1} << 20;
} // namespace

Reader::Reader(const char* data, size_t size, std::string what, Options options)
    : data_(data), size_(size), what_(std::move(what)), options_(std::move(options)) {}

void Reader::fail(const std::string& why) const {
  throw std::runtime_error(c10::str(what_, ": not a pickle ddp can read: ", why, " (at byte ", op_at_, ")"));
}

uint8_t Reader::byte() {
  if (at_ >= size_) {
    fail("it ends before its STOP opcode (truncated?)");
  }
  return static_cast<uint8_t>(data_[at_++]);
}

std::string Reader::bytes(uint64_t n) {
  if (n > size_ - at_) {
    fail(c10::str("it ends inside a ", n, "-byte string (truncated?)"));
  }
  std::string s(data_ + at_, static_cast<size_t>(n));
  at_ += static_cast<size_t>(n);
  return s;
}

uint64_t Reader::little(int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(byte()) << (8 * i);
  }
  return v;
}

ValuePtr Reader::pop() {
  if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
    fail("an opcode takes a value from an empty stack");
  }
  auto v = std::move(stack_.back());
  stack_.pop_back();
  return v;
}

ValuePtr& Reader::top() {
  if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
    fail("an opcode needs a value on an empty stack");
  }
  return stack_.back();
}

std::vector<ValuePtr> Reader::pop_mark() {
  if (marks_.empty()) {
    fail("an opcode needs a MARK that is not there");
  }
  const size_t from = marks_.back();
  marks_.pop_back();
  std::vector<ValuePtr> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(from)),
                              std::make_move_iterator(stack_.end()));
  stack_.resize(from);
  return items;
}

void Reader::push(ValuePtr value) {
  if (stack_.size() >= kMaxStack) {
    fail("the stack grows beyond a million values");
  }
  stack_.push_back(std::move(value));
}

void Reader::memo_put(uint64_t index) {
  if (index >= kMaxMemo) {
    fail(c10::str("memo index ", index, " is out of range"));
  }
  if (index >= memo_.size()) {
    memo_.resize(index + 1);
  }
  memo_[index] = top();
}

ValuePtr Reader::memo_get(uint64_t index) {
  if (index >= memo_.size() || !memo_[index]) {
    fail(c10::str("memo index ", index, " was never stored"));
  }
  return memo_[index];
}

ValuePtr Reader::make_call(ValuePtr callable, std::vector<ValuePtr> args, bool newobj) {
  // collections.OrderedDict() is the one call whose result later opcodes
  // change (SETITEMS): it must be a dict.
  if (callable->is_global("collections", "OrderedDict")) {
    auto d = dict({}, true);
    if (!args.empty()) {
      // OrderedDict([(k, v), ...]).
      if (args.size() != 1 || !args[0]->is(Value::Kind::kList)) {
        fail("collections.OrderedDict called with arguments other than a list of pairs");
      }
      for (const auto& pair : args[0]->items) {
        if (!(pair->is(Value::Kind::kTuple) || pair->is(Value::Kind::kList)) || pair->items.size() != 2) {
          fail("collections.OrderedDict called with something other than pairs");
        }
        d->entries.emplace_back(pair->items[0], pair->items[1]);
      }
    }
    return d;
  }
  if (options_.on_call) {
    if (auto v = options_.on_call(*callable, args)) {
      return v;
    }
  }
  auto v = call(std::move(callable), std::move(args));
  v->newobj = newobj;
  return v;
}

void Reader::set_items(Value& target, std::vector<ValuePtr>& kv) {
  if (!target.is(Value::Kind::kDict)) {
    fail("SETITEMS on something that is not a dict (" + target.describe() + ")");
  }
  if (kv.size() % 2 != 0) {
    fail("SETITEMS with an odd number of values");
  }
  for (size_t i = 0; i < kv.size(); i += 2) {
    target.entries.emplace_back(kv[i], kv[i + 1]);
  }
}

ValuePtr Reader::read() {
  for (;;) {
    op_at_ = at_;
    const uint8_t op = byte();
    switch (op) {
      case 0x80: { // PROTO
        const uint8_t protocol = byte();
        if (protocol > 5) {
          fail(c10::str("protocol ", int(protocol), " (ddp reads 0 to 5)"));
        }
        break;
      }
      case 0x95: // FRAME: a length that only helps readers that prefetch
        little(8);
        break;
      case '.': { // STOP
        if (stack_.size() != 1 || !marks_.empty()) {
          fail(c10::str("STOP with ", stack_.size(), " values on the stack, expected 1"));
        }
        return stack_.back();
      }
      case '(': // MARK
        marks_.push_back(stack_.size());
        break;
      case '0': // POP
        pop();
        break;
      case '1': // POP_MARK
        pop_mark();
        break;
      case '2': // DUP
        push(top());
        break;
      case 'N':
        push(none());
        break;
      case 0x88:
        push(boolean(true));
        break;
      case 0x89:
        push(boolean(false));
        break;
      case 'K':
        push(integer(static_cast<int64_t>(little(1))));
        break;
      case 'M':
        push(integer(static_cast<int64_t>(little(2))));
        break;
      case 'J':
        push(integer(static_cast<int32_t>(static_cast<uint32_t>(little(4)))));
        break;
      case 0x8a:   // LONG1
      case 0x8b: { // LONG4
        const uint64_t n = op == 0x8a ? little(1) : little(4);
        if (n > 8) {
          fail(c10::str("an integer of ", n, " bytes (ddp reads up to 64 bits)"));
        }
        if (n > size_ - at_) {
          fail("it ends inside an integer (truncated?)");
        }
        uint64_t u = little(static_cast<int>(n));
        if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) {
          u |= ~uint64_t{0} << (8 * n); // sign extension
        }
        push(integer(static_cast<int64_t>(u)));
        break;
      }
      case 'I': { // INT (protocol 0): decimal text, 00/01 for False/True
        std::string text;
        for (char c = static_cast<char>(byte()); c != '\n'; c = static_cast<char>(byte())) {
          text += c;
        }
        if (text == "00" || text == "01") {
          push(boolean(text == "01"));
        } else {
          try {
            push(integer(std::stoll(text)));
          } catch (const std::exception&) {
            fail("INT with text '" + text + "'");
          }
        }
        break;
      }
      case 'G': { // BINFLOAT: big-endian double
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) {
          bits = (bits << 8) | byte();
        }
        double d;
        std::memcpy(&d, &bits, sizeof d);
        push(number(d));
        break;
      }
      case 'X':
        push(string(bytes(little(4))));
        break;
      case 0x8c:
        push(string(bytes(little(1))));
        break;
      case 0x8d:
        push(string(bytes(little(8))));
        break;
      case 'C':
      case 'B':
      case 0x8e:
      case 0x96: { // SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
        auto v = string(bytes(little(op == 'C' ? 1 : op == 'B' ? 4 : 8)));
        v->kind = Value::Kind::kBytes;
        push(std::move(v));
        break;
      }
      case ')':
        push(tuple({}));
        break;
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<ValuePtr> items(op - 0x84);
        for (size_t i = items.size(); i-- > 0;) {
          items[i] = pop();
        }
        push(tuple(std::move(items)));
        break;
      }
      case 't':
        push(tuple(pop_mark()));
        break;
      case ']':
        push(list({}));
        break;
      case 'l':
        push(list(pop_mark()));
        break;
      case 0x8f: // EMPTY_SET: read as a list
        push(list({}));
        break;
      case 0x91: // FROZENSET
        push(list(pop_mark()));
        break;
      case 'a': { // APPEND
        auto v = pop();
        auto& target = top();
        if (!target->is(Value::Kind::kList)) {
          fail("APPEND to something that is not a list (" + target->describe() + ")");
        }
        target->items.push_back(std::move(v));
        break;
      }
      case 'e':
      case 0x90: { // APPENDS, ADDITEMS
        auto items = pop_mark();
        auto& target = top();
        if (!target->is(Value::Kind::kList)) {
          fail("APPENDS to something that is not a list (" + target->describe() + ")");
        }
        for (auto& item : items) {
          target->items.push_back(std::move(item));
        }
        break;
      }
      case '}':
        push(dict({}));
        break;
      case 'd': {
        auto kv = pop_mark();
        auto d = dict({});
        set_items(*d, kv);
        push(std::move(d));
        break;
      }
      case 's': { // SETITEM
        auto v = pop();
        auto k = pop();
        std::vector<ValuePtr> kv{std::move(k), std::move(v)};
        set_items(*top(), kv);
        break;
      }
      case 'u': { // SETITEMS
        auto kv = pop_mark();
        set_items(*top(), kv);
        break;
      }
      case 'c': { // GLOBAL: "module\nname\n"
        std::string module, name;
        for (char c = static_cast<char>(byte()); c != '\n'; c = static_cast<char>(byte())) {
          module += c;
        }
        for (char c = static_cast<char>(byte()); c != '\n'; c = static_cast<char>(byte())) {
          name += c;
        }
        push(global(std::move(module), std::move(name)));
        break;
      }
      case 0x93: { // STACK_GLOBAL
        auto name = pop();
        auto module = pop();
        if (!module->is(Value::Kind::kString) || !name->is(Value::Kind::kString)) {
          fail("STACK_GLOBAL of something other than two strings");
        }
        push(global(module->text, name->text));
        break;
      }
      case 'R': { // REDUCE
        auto args = pop();
        auto callable = pop();
        if (!args->is(Value::Kind::kTuple)) {
          fail("REDUCE with arguments that are not a tuple (" + args->describe() + ")");
        }
        push(make_call(std::move(callable), args->items, false));
        break;
      }
      case 0x81: { // NEWOBJ
        auto args = pop();
        auto cls = pop();
        if (!args->is(Value::Kind::kTuple)) {
          fail("NEWOBJ with arguments that are not a tuple (" + args->describe() + ")");
        }
        push(make_call(std::move(cls), args->items, true));
        break;
      }
      case 0x92: { // NEWOBJ_EX: cls, args, kwargs (kwargs kept as a last argument)
        auto kwargs = pop();
        auto args = pop();
        auto cls = pop();
        if (!args->is(Value::Kind::kTuple) || !kwargs->is(Value::Kind::kDict)) {
          fail("NEWOBJ_EX with arguments that are not a tuple and a dict");
        }
        auto all = args->items;
        if (!kwargs->entries.empty()) {
          all.push_back(kwargs);
        }
        push(make_call(std::move(cls), std::move(all), true));
        break;
      }
      case 'b': { // BUILD
        auto state = pop();
        auto& target = top();
        if (target->is(Value::Kind::kDict)) {
          // An OrderedDict's attributes (a state dict's `_metadata`): not data.
          break;
        }
        if (!target->is(Value::Kind::kCall)) {
          fail("BUILD on something that is not an object (" + target->describe() + ")");
        }
        target->state = std::move(state);
        break;
      }
      case 'Q': { // BINPERSID
        auto id = pop();
        if (!options_.persistent_load) {
          fail("a persistent id where none is expected");
        }
        push(options_.persistent_load(*id));
        break;
      }
      case 'q':
        memo_put(little(1));
        break;
      case 'r':
        memo_put(little(4));
        break;
      case 0x94: // MEMOIZE
        memo_put(memo_.size());
        break;
      case 'p': { // PUT (protocol 0): decimal index
        std::string text;
        for (char c = static_cast<char>(byte()); c != '\n'; c = static_cast<char>(byte())) {
          text += c;
        }
        try {
          memo_put(std::stoull(text));
        } catch (const std::logic_error&) {
          fail("PUT with index '" + text + "'");
        }
        break;
      }
      case 'h':
        push(memo_get(little(1)));
        break;
      case 'j':
        push(memo_get(little(4)));
        break;
      case 'g': {
        std::string text;
        for (char c = static_cast<char>(byte()); c != '\n'; c = static_cast<char>(byte())) {
          text += c;
        }
        try {
          push(memo_get(std::stoull(text)));
        } catch (const std::logic_error&) {
          fail("GET with index '" + text + "'");
        }
        break;
      }
      default:
        fail(c10::str("opcode 0x", c10::str(std::hex, int(op)), " is not one ddp reads"));
    }
  }
}

} // namespace ddp::checkpoint::pickle
