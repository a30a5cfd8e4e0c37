// The JSON reader that `ddprun --analyze` reads dumps with
// (src/internal/json.h, over nlohmann/json): what a dump holds, and bad
// input refused with the offset of the problem, never a crash; and the
// writer's strings, always UTF-8.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "internal/json.h"
#include "internal/text_files.h"

namespace ddp::json {
namespace {

TEST(JsonTest, ReadsWhatADumpHolds) {
  const Value v = parse(R"( {"schema": "ddp-flight-recorder", "version": 1, "ok": true, "none": null,
      "at": 1764107000000123, "groups": [{"name": "default", "entries": []}],
      "text": "a \"quoted\" line\nand \u00e9 \\ tab\t"} )");
  ASSERT_TRUE(v.is(Value::Kind::kObject));
  EXPECT_EQ(v.string_or("schema", ""), "ddp-flight-recorder");
  EXPECT_EQ(v.int_or("version", 0), 1);
  EXPECT_EQ(v.int_or("at", 0), 1764107000000123); // microseconds stay exact
  EXPECT_TRUE(v.find("ok")->boolean);
  EXPECT_TRUE(v.find("none")->is(Value::Kind::kNull));
  EXPECT_EQ(v.string_or("text", ""), "a \"quoted\" line\nand \xc3\xa9 \\ tab\t");
  const Value* groups = v.find("groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->items.size(), 1u);
  EXPECT_EQ(groups->items[0].string_or("name", ""), "default");
  EXPECT_TRUE(groups->items[0].find("entries")->items.empty());
  // Absent or of another kind: the fallback.
  EXPECT_EQ(v.string_or("missing", "x"), "x");
  EXPECT_EQ(v.int_or("schema", -1), -1);
}

void expect_refused(const std::string& text, const std::string& expected) {
  try {
    parse(text);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(JsonTest, RefusesBadInputNamingTheOffset) {
  expect_refused("", "unexpected end");
  expect_refused("{\"a\": 1", "unexpected end of input; expected '}' at offset 7");
  expect_refused("{\"a\" 1}", "expected ':'");
  expect_refused("[1, 2,", "unexpected end");
  expect_refused("\"open", "missing closing quote");
  expect_refused("tru", "invalid literal; last read: 'tru'");
  expect_refused("{} x", "expected end of input at offset 3");
  expect_refused("\"\\u12\"", "'\\u' must be followed by 4 hex digits");
  expect_refused("@", "invalid literal; last read: '@' at offset 0");
  expect_refused(std::string(100, '[') + std::string(100, ']'), "nesting deeper than 64");
}

TEST(JsonTest, ReadsSurrogatePairsAndRefusesBytesThatAreNotUtf8) {
  EXPECT_EQ(parse(R"("\ud83d\ude00 \u00e9")").text, "\xf0\x9f\x98\x80 \xc3\xa9");
  expect_refused("\"a \xff\"", "UTF-8");
  expect_refused("\"\\ud83d\"", "surrogate");
}

// What ddp writes is read back whatever bytes a message held: a message cut
// inside a character, or bytes that were never UTF-8, become U+FFFD.
TEST(JsonTest, WritesBytesThatAreNotUtf8AsTheReplacementCharacter) {
  std::string out;
  internal::append_json_string(out, "ok \xc3\xa9 \xf0\x9f\x98\x80 latin \xe9 cut \xc3");
  EXPECT_EQ(out, "\"ok \xc3\xa9 \xf0\x9f\x98\x80 latin \\ufffd cut \\ufffd\"");
  EXPECT_EQ(parse(out).text, "ok \xc3\xa9 \xf0\x9f\x98\x80 latin \xef\xbf\xbd cut \xef\xbf\xbd");
}

} // namespace
} // namespace ddp::json
