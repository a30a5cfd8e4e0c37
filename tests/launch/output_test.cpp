// LineSplitter: how ddprun cuts a rank's byte stream into prefixed lines.

#include <gtest/gtest.h>

#include <string>

#include "launch/output.h"

namespace ddp::launch {
namespace {

TEST(LineSplitterTest, PrefixesEveryCompleteLine) {
  LineSplitter lines("[rank 3]: ");
  EXPECT_EQ(lines.feed("a\nbb\n"), "[rank 3]: a\n[rank 3]: bb\n");
  EXPECT_EQ(lines.feed("\n"), "[rank 3]: \n"); // an empty line is a line too
  EXPECT_EQ(lines.finish(), "");
}

TEST(LineSplitterTest, HoldsAPartialLineUntilItsNewline) {
  LineSplitter lines("[rank 0]: ");
  EXPECT_EQ(lines.feed("hel"), "");
  EXPECT_EQ(lines.feed("lo"), "");
  EXPECT_EQ(lines.feed(" world\nnext"), "[rank 0]: hello world\n");
  EXPECT_EQ(lines.feed(" line\n"), "[rank 0]: next line\n");
}

TEST(LineSplitterTest, FlushesThePartialLastLineAtEof) {
  LineSplitter prefixed("[rank 1]: ");
  EXPECT_EQ(prefixed.feed("done\ntail"), "[rank 1]: done\n");
  // With a prefix, the flushed line is ended so the next prefix starts a line.
  EXPECT_EQ(prefixed.finish(), "[rank 1]: tail\n");
  EXPECT_EQ(prefixed.finish(), "");

  LineSplitter plain;
  EXPECT_EQ(plain.feed("done\ntail"), "done\n");
  EXPECT_EQ(plain.finish(), "tail"); // without a prefix, bytes come out unchanged
}

TEST(LineSplitterTest, NoPrefixPassesBytesThroughUnchanged) {
  LineSplitter lines;
  std::string in = "one\ntwo\r\nthree\x01\n";
  std::string out;
  for (char c : in) {
    out += lines.feed(std::string(1, c));
  }
  out += lines.finish();
  EXPECT_EQ(out, in);
}

TEST(LineSplitterTest, CutsOverlongLines) {
  LineSplitter prefixed("> ", /*max_line_bytes=*/4);
  EXPECT_EQ(prefixed.feed("abcdefghij"), "> abcd\n> efgh\n");
  EXPECT_EQ(prefixed.feed("\n"), "> ij\n");

  LineSplitter plain("", /*max_line_bytes=*/4);
  EXPECT_EQ(plain.feed("abcdefghij"), "abcdefgh");
  EXPECT_EQ(plain.feed("\n"), "ij\n");
}

} // namespace
} // namespace ddp::launch
