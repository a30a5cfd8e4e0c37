#include "internal/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "internal/text_files.h"

namespace ddp::json {

namespace {

constexpr int kMaxDepth = 64; // nesting a dump never reaches; a bound for bad input

class Reader {
 public:
  explicit Reader(const std::string& text) : text_(text) {}

  Value document() {
    Value value = read(0);
    skip_space();
    if (at_ != text_.size()) {
      fail("text after the document");
    }
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(at_));
  }

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }

  char peek() {
    skip_space();
    if (at_ >= text_.size()) {
      fail("unexpected end");
    }
    return text_[at_];
  }

  void expect(char c) {
    if (peek() != c) {
      fail(std::string("expected '") + c + "'");
    }
    ++at_;
  }

  void literal(const char* word) {
    for (const char* p = word; *p != '\0'; ++p, ++at_) {
      if (at_ >= text_.size() || text_[at_] != *p) {
        fail(std::string("expected ") + word);
      }
    }
  }

  Value read(int depth) {
    if (depth > kMaxDepth) {
      fail("nesting deeper than " + std::to_string(kMaxDepth));
    }
    Value value;
    const char c = peek();
    if (c == '{') {
      value.kind = Value::Kind::kObject;
      ++at_;
      if (peek() == '}') {
        ++at_;
        return value;
      }
      for (;;) {
        if (peek() != '"') {
          fail("expected a member name");
        }
        std::string name = string();
        expect(':');
        value.members[std::move(name)] = read(depth + 1);
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind = Value::Kind::kArray;
      ++at_;
      if (peek() == ']') {
        ++at_;
        return value;
      }
      for (;;) {
        value.items.push_back(read(depth + 1));
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind = Value::Kind::kString;
      value.text = string();
      return value;
    }
    if (c == 't' || c == 'f') {
      value.kind = Value::Kind::kBool;
      value.boolean = c == 't';
      literal(c == 't' ? "true" : "false");
      return value;
    }
    if (c == 'n') {
      literal("null");
      return value;
    }
    value.kind = Value::Kind::kNumber;
    const char* begin = text_.c_str() + at_;
    char* end = nullptr;
    value.number = std::strtod(begin, &end);
    if (end == begin) {
      fail("expected a value");
    }
    at_ += static_cast<size_t>(end - begin);
    return value;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) {
        break;
      }
      c = text_[at_++];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) {
            fail("a short \\u escape");
          }
          const std::string hex = text_.substr(at_, 4);
          char* end = nullptr;
          const unsigned long code = std::strtoul(hex.c_str(), &end, 16);
          if (end != hex.c_str() + 4) {
            fail("a bad \\u escape");
          }
          append_utf8(out, static_cast<unsigned>(code));
          at_ += 4;
          break;
        }
        default:
          out += c; // \" \\ \/
      }
    }
    if (at_ >= text_.size()) {
      fail("an unterminated string");
    }
    ++at_;
    return out;
  }

  const std::string& text_;
  size_t at_ = 0;
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
  return Reader(text).document();
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
