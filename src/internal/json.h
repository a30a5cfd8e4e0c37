#pragma once

// JSON documents as ddp reads and writes them (no Torch, so that ddprun
// uses it too): safetensors headers, the flight recorder's dumps, the
// timeline's traces. Reading is nlohmann/json's; a Value is the small tree
// the readers walk, so that only json.cpp includes the library. parse
// throws std::runtime_error naming the offset of the first thing it cannot
// read (malformed text, invalid UTF-8, nesting deeper than 64).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddp::json {

struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Value> items;                 // kArray
  std::map<std::string, Value> members;     // kObject

  bool is(Kind k) const {
    return kind == k;
  }
  // The member `name` of an object, or nullptr.
  const Value* find(const std::string& name) const;
  // The member's string / number, or `fallback` when absent or of another kind.
  std::string string_or(const std::string& name, const std::string& fallback) const;
  int64_t int_or(const std::string& name, int64_t fallback) const;
};

// A number value, and a string value, for building documents to write.
Value number_value(double value);
Value string_value(const std::string& text);

// Parses a whole document; trailing text other than whitespace is an error.
Value parse(const std::string& text);

// Appends `value` as JSON text: objects' members in name order, a whole
// number below 2^53 without a fraction, other numbers with 17 digits.
void write(const Value& value, std::string& out);

} // namespace ddp::json
