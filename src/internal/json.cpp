// Reading is nlohmann/json's (Debian's nlohmann-json3-dev, 3.10 or later
// 3.x: src/internal/internal.cmake); this file is the only one that
// includes it, which keeps its compile time (about 2 s a file) to one file
// of the library and one of ddprun. Writing stays here: a few lines, with
// the number format the dumps and traces have always had.

#include "internal/json.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <utility>

static_assert(NLOHMANN_JSON_VERSION_MAJOR == 3 && NLOHMANN_JSON_VERSION_MINOR >= 10,
              "ddp reads JSON through nlohmann/json 3.10 to 3.x");

#include "internal/text_files.h"

namespace ddp::json {

namespace {

constexpr size_t kMaxDepth = 64; // nesting a dump never reaches; a bound for bad input

using Library = nlohmann::json;

// Builds a Value as nlohmann/json's parser reads the text (its SAX
// interface: no intermediate document). Errors are std::runtime_error
// "JSON: <what> at offset <N>".
class Builder final : public nlohmann::json_sax<Library> {
 public:
  Value take() {
    return std::move(result_);
  }

  bool null() override {
    return add(Value());
  }
  bool boolean(bool value) override {
    Value v;
    v.kind = Value::Kind::kBool;
    v.boolean = value;
    return add(std::move(v));
  }
  bool number_integer(number_integer_t value) override {
    return add(number_value(static_cast<double>(value)));
  }
  bool number_unsigned(number_unsigned_t value) override {
    return add(number_value(static_cast<double>(value)));
  }
  bool number_float(number_float_t value, const string_t&) override {
    return add(number_value(value));
  }
  bool string(string_t& value) override {
    return add(string_value(value));
  }
  bool binary(binary_t&) override {
    return false; // not in JSON text
  }
  bool start_object(std::size_t) override {
    return open(Value::Kind::kObject);
  }
  bool key(string_t& name) override {
    names_.back() = name;
    return true;
  }
  bool end_object() override {
    return close();
  }
  bool start_array(std::size_t) override {
    return open(Value::Kind::kArray);
  }
  bool end_array() override {
    return close();
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    // "[json.exception.parse_error.101] parse error at line 1, column 8:
    // syntax error while parsing object - unexpected end of input; ..."
    // without its codes and line and column: the offset says where.
    std::string what = e.what();
    const auto colon = what.find(": ", what.find("column"));
    if (colon != std::string::npos) {
      what = what.substr(colon + 2);
    }
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(position > 0 ? position - 1 : 0));
  }

 private:
  bool add(Value value) {
    if (open_.empty()) {
      result_ = std::move(value);
    } else if (open_.back().kind == Value::Kind::kArray) {
      open_.back().items.push_back(std::move(value));
    } else {
      open_.back().members[names_.back()] = std::move(value);
    }
    return true;
  }
  bool open(Value::Kind kind) {
    if (open_.size() >= kMaxDepth) {
      throw std::runtime_error("JSON: nesting deeper than " + std::to_string(kMaxDepth));
    }
    open_.emplace_back();
    open_.back().kind = kind;
    names_.emplace_back();
    return true;
  }
  bool close() {
    Value done = std::move(open_.back());
    open_.pop_back();
    names_.pop_back();
    return add(std::move(done));
  }

  Value result_;
  std::vector<Value> open_;        // the objects and arrays being read, outermost first
  std::vector<std::string> names_; // each open object's current member name
};

} // namespace

const Value* Value::find(const std::string& name) const {
  const auto found = members.find(name);
  return found == members.end() ? nullptr : &found->second;
}

std::string Value::string_or(const std::string& name, const std::string& fallback) const {
  const Value* v = find(name);
  return v != nullptr && v->is(Kind::kString) ? v->text : fallback;
}

int64_t Value::int_or(const std::string& name, int64_t fallback) const {
  const Value* v = find(name);
  return v != nullptr && v->is(Kind::kNumber) ? static_cast<int64_t>(v->number) : fallback;
}

Value parse(const std::string& text) {
  Builder builder;
  // Strict: text after the document is an error.
  Library::sax_parse(text, &builder, Library::input_format_t::json, /*strict=*/true);
  return builder.take();
}

void write(const Value& value, std::string& out) {
  switch (value.kind) {
    case Value::Kind::kNull:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += value.boolean ? "true" : "false";
      return;
    case Value::Kind::kNumber: {
      char text[40];
      if (std::isfinite(value.number) && std::fabs(value.number) < 9007199254740992.0 &&
          value.number == std::floor(value.number)) {
        std::snprintf(text, sizeof(text), "%lld", static_cast<long long>(value.number));
      } else if (std::isfinite(value.number)) {
        std::snprintf(text, sizeof(text), "%.17g", value.number);
      } else {
        std::snprintf(text, sizeof(text), "null"); // JSON has no infinity
      }
      out += text;
      return;
    }
    case Value::Kind::kString:
      internal::append_json_string(out, value.text);
      return;
    case Value::Kind::kArray:
      out += '[';
      for (size_t i = 0; i < value.items.size(); ++i) {
        out += i == 0 ? "" : ", ";
        write(value.items[i], out);
      }
      out += ']';
      return;
    case Value::Kind::kObject: {
      out += '{';
      bool first = true;
      for (const auto& [name, member] : value.members) {
        out += first ? "" : ", ";
        first = false;
        internal::append_json_string(out, name);
        out += ": ";
        write(member, out);
      }
      out += '}';
      return;
    }
  }
}

Value number_value(double value) {
  Value v;
  v.kind = Value::Kind::kNumber;
  v.number = value;
  return v;
}

Value string_value(const std::string& text) {
  Value v;
  v.kind = Value::Kind::kString;
  v.text = text;
  return v;
}

} // namespace ddp::json
