// The timeline's rules in one process (Note [Timeline] in
// src/timeline/timeline.cpp): which steps it keeps, the lanes that keep a
// track's spans from overlapping, the per-step bound, the file and its
// failure; and ddprun's merge of the ranks' files and its picture
// (src/launch/readers/trace_merge.h). A real job's trace: run_trace_test.sh.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "internal/json.h"
#include "timeline/timeline.h"
#include "launch/readers/trace_merge.h"

namespace ddp::internal {
namespace {

json::Value parsed(const Timeline& timeline) {
  return json::parse(timeline.json());
}

// The X and i events of a parsed trace.
std::vector<const json::Value*> spans_of(const json::Value& trace) {
  std::vector<const json::Value*> spans;
  for (const json::Value& event : trace.find("traceEvents")->items) {
    const std::string ph = event.string_or("ph", "");
    if (ph == "X" || ph == "i") {
      spans.push_back(&event);
    }
  }
  return spans;
}

std::map<int64_t, std::string> thread_names(const json::Value& trace) {
  std::map<int64_t, std::string> names;
  for (const json::Value& event : trace.find("traceEvents")->items) {
    if (event.string_or("ph", "") == "M" && event.string_or("name", "") == "thread_name") {
      names[event.int_or("tid", -1)] = event.find("args")->string_or("name", "");
    }
  }
  return names;
}

std::string temp_dir() {
  std::string pattern = ::testing::TempDir() + "timeline_test.XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  EXPECT_NE(::mkdtemp(buffer.data()), nullptr);
  return buffer.data();
}

TEST(TimelineTest, KeepsTheLastStepsAsARing) {
  Timeline timeline("/nonexistent", /*keep_last=*/2, 1, 0);
  timeline.set_rank(3, 4);
  timeline.complete(Timeline::kStepTrack, "before", 10, 20); // step 0: dropped with the ring
  for (int step = 1; step <= 4; ++step) {
    EXPECT_EQ(timeline.begin_step(), step);
    timeline.complete(Timeline::kStepTrack, "forward", step * 1000, step * 1000 + 100);
  }
  const json::Value trace = parsed(timeline);
  const auto spans = spans_of(trace);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0]->find("args")->int_or("step", 0), 3);
  EXPECT_EQ(spans[1]->find("args")->int_or("step", 0), 4);
  EXPECT_EQ(spans[1]->int_or("pid", -1), 3);
  EXPECT_EQ(spans[1]->int_or("ts", 0), 4000);
  EXPECT_EQ(spans[1]->int_or("dur", 0), 100);
  const json::Value* other = trace.find("otherData");
  EXPECT_EQ(other->string_or("schema", ""), "ddp-timeline");
  EXPECT_EQ(other->int_or("rank", -1), 3);
  EXPECT_EQ(other->int_or("world_size", -1), 4);
  EXPECT_EQ(other->int_or("first_step", -1), 3);
  EXPECT_EQ(other->int_or("last_step", -1), 4);
}

TEST(TimelineTest, KeepsAStepRange) {
  Timeline timeline("/nonexistent", /*keep_last=*/0, 2, 3);
  timeline.set_rank(0, 1);
  timeline.complete(Timeline::kStepTrack, "before", 10, 20);
  for (int step = 1; step <= 5; ++step) {
    timeline.begin_step();
    timeline.complete(Timeline::kStepTrack, "forward", step * 1000, step * 1000 + 100);
  }
  std::set<int64_t> steps;
  const json::Value trace = parsed(timeline); // outlives the pointers into it
  for (const json::Value* span : spans_of(trace)) {
    steps.insert(span->find("args")->int_or("step", 0));
  }
  EXPECT_EQ(steps, (std::set<int64_t>{2, 3}));
}

TEST(TimelineTest, SpreadsOverlappingSpansOverLanes) {
  Timeline timeline("/nonexistent", 5, 1, 0);
  timeline.set_rank(0, 1);
  timeline.begin_step();
  // Bucket 1 launched while bucket 0 is still reduced: not nested, so
  // another lane; bucket 2 starts after bucket 0 ended: the first lane again.
  timeline.complete(Timeline::kBucketTrack, "bucket 0", 100, 300);
  timeline.complete(Timeline::kBucketTrack, "bucket 1", 200, 400);
  timeline.complete(Timeline::kBucketTrack, "bucket 2", 300, 500);
  timeline.instant(Timeline::kBucketTrack, "bucket 2 ready", 250);
  const int user = timeline.track("my track");
  EXPECT_EQ(timeline.track("my track"), user);
  timeline.complete(user, "mine", 0, 1, "\"note\": \"a \\\"quoted\\\" word\"");
  const json::Value trace = parsed(timeline);
  std::map<std::string, int64_t> tid_of;
  for (const json::Value* span : spans_of(trace)) {
    tid_of[span->string_or("name", "")] = span->int_or("tid", -1);
  }
  EXPECT_EQ(tid_of["bucket 0"], tid_of["bucket 2"]);
  EXPECT_NE(tid_of["bucket 0"], tid_of["bucket 1"]);
  const auto names = thread_names(trace);
  EXPECT_EQ(names.at(tid_of["bucket 0"]), "buckets");
  EXPECT_EQ(names.at(tid_of["bucket 1"]), "buckets #2");
  EXPECT_EQ(names.at(tid_of["mine"]), "my track");
  for (const json::Value* span : spans_of(trace)) {
    if (span->string_or("name", "") == "mine") {
      EXPECT_EQ(span->find("args")->string_or("note", ""), "a \"quoted\" word");
    }
  }
}

TEST(TimelineTest, BoundsTheEventsOfAStep) {
  Timeline timeline("/nonexistent", 1, 1, 0);
  timeline.set_rank(0, 1);
  timeline.begin_step();
  for (int i = 0; i < 20005; ++i) {
    timeline.instant(Timeline::kWaitTrack, "x", i);
  }
  const json::Value trace = parsed(timeline);
  EXPECT_EQ(spans_of(trace).size(), 20000u);
  EXPECT_EQ(trace.find("otherData")->int_or("dropped_events", 0), 5);
}

TEST(TimelineTest, ParsesDdpTraceSteps) {
  int64_t keep = 0, first = 0, last = 0;
  parse_trace_steps("7", keep, first, last);
  EXPECT_EQ(keep, 7);
  parse_trace_steps("10-12", keep, first, last);
  EXPECT_EQ(keep, 0);
  EXPECT_EQ(first, 10);
  EXPECT_EQ(last, 12);
  for (const char* bad : {"", "0", "-3", "x", "5-", "-", "4-2", "1-x", "200000", "+3"}) {
    try {
      parse_trace_steps(bad, keep, first, last);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("DDP_TRACE_STEPS must be K"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("got '" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(TimelineTest, WritesItsFileOrSaysWhyNot) {
  const std::string dir = temp_dir();
  {
    Timeline timeline(dir + "/sub", 3, 1, 0);
    EXPECT_EQ(timeline.write(), ""); // no group yet: nothing names the file
    timeline.set_rank(1, 2);
    timeline.begin_step();
    timeline.complete(Timeline::kStepTrack, "forward", 5, 9);
    const std::string path = timeline.write();
    EXPECT_EQ(path, dir + "/sub/trace_rank_1.json");
    std::ifstream file(path);
    const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, timeline.json());
  }
  // A directory that cannot be made: a warning and "", never a throw.
  Timeline blocked("/proc/no/such/dir", 3, 1, 0);
  blocked.set_rank(0, 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(blocked.write(), "");
  const std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("[rank 0] timeline: could not write its trace (cannot create /proc/no"), std::string::npos)
      << warning;
  EXPECT_NE(warning.find("DDP_TRACE_DIR"), std::string::npos) << warning;
}

TEST(TimelineTest, DdprunMergesTheRanksAndDrawsThem) {
  const std::string dir = temp_dir();
  for (int rank = 0; rank < 2; ++rank) {
    Timeline timeline(dir, 5, 1, 0);
    timeline.set_rank(rank, 3); // rank 2 writes nothing
    const int group = timeline.track("collectives: default (gloo)");
    for (int step = 1; step <= 4; ++step) {
      timeline.begin_step();
      const int64_t t = step * 10000 + rank * 100;
      timeline.complete(Timeline::kStepTrack, "forward", t, t + 1000);
      timeline.complete(Timeline::kStepTrack, "backward", t + 1200, t + 3000);
      timeline.complete(Timeline::kBucketTrack, "bucket 0", t + 2000, t + 3500);
      timeline.complete(Timeline::kBucketTrack, "bucket 1", t + 2500, t + 4000);
      timeline.complete(group, "allreduce <&>", t + 2000, t + 3400);
    }
    ASSERT_NE(timeline.write(), "");
  }
  std::ofstream(dir + "/trace_rank_7.json") << "{not json";
  std::vector<std::string> problems;
  const timeline::MergedTrace merged = timeline::read_traces(dir, problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("trace_rank_7.json: JSON:"), std::string::npos) << problems[0];
  EXPECT_EQ(merged.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(merged.world_size, 3);
  EXPECT_EQ(merged.first_step, 0); // the ring of 5 still holds what came before step 1
  EXPECT_EQ(merged.last_step, 4);
  // Per rank: DDP step, buckets, buckets #2, the group's collectives.
  ASSERT_EQ(merged.rows.size(), 8u);
  EXPECT_EQ(merged.rows[0].rank, 0);
  EXPECT_EQ(merged.rows[0].track, "DDP step");
  EXPECT_EQ(merged.rows[7].rank, 1);
  EXPECT_EQ(merged.rows[7].track, "collectives: default (gloo)");

  const json::Value both = json::parse(timeline::merged_json(merged));
  std::set<int64_t> pids;
  for (const json::Value& event : both.find("traceEvents")->items) {
    pids.insert(event.int_or("pid", -1));
  }
  EXPECT_EQ(pids, (std::set<int64_t>{0, 1}));
  EXPECT_EQ(both.find("otherData")->string_or("schema", ""), "ddp-timeline-merged");

  const std::string svg = timeline::trace_svg(merged, 3);
  size_t rows = 0;
  for (size_t at = svg.find("<g class=\"row\""); at != std::string::npos; at = svg.find("<g class=\"row\"", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, 8u);
  EXPECT_NE(svg.find("steps 2-4"), std::string::npos);
  EXPECT_EQ(svg.find("step 1)"), std::string::npos); // only the last 3 steps are drawn
  EXPECT_NE(svg.find("allreduce &lt;&amp;&gt;"), std::string::npos); // escaped for XML

  // The command: both files, where they are, and who wrote none.
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(timeline::merge_directory(dir, stdout, stderr), 0);
  const std::string said = testing::internal::GetCapturedStdout();
  const std::string warned = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("ddprun: timeline of 2 rank(s), steps 0-4, in " + dir + "/trace.json"), std::string::npos)
      << said;
  EXPECT_NE(said.find("no trace from rank(s) 2"), std::string::npos) << said;
  EXPECT_NE(warned.find("skipping " + dir + "/trace_rank_7.json"), std::string::npos) << warned;
  EXPECT_TRUE(std::ifstream(dir + "/trace.json").good());
  EXPECT_TRUE(std::ifstream(dir + "/trace.svg").good());

  timeline::clear_traces(dir);
  EXPECT_FALSE(std::ifstream(dir + "/trace_rank_0.json").good());
  EXPECT_FALSE(std::ifstream(dir + "/trace.json").good());
  testing::internal::CaptureStderr();
  EXPECT_EQ(timeline::merge_directory(dir, stdout, stderr), 1);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("no trace in " + dir), std::string::npos);
}

} // namespace
} // namespace ddp::internal
