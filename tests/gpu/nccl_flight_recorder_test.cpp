// The flight recorder on the NCCL backend (Note [Flight recorder]): an NCCL
// group's collectives are recorded with their shapes and states, written by
// ddp::dump_flight_recorder(), and a wait() that times out on the GPU writes
// the dump by itself, with the operation still "started". World size 1: the
// recording does not depend on the number of ranks (the Gloo and MPI cases
// with 2 ranks are in tests/flight_recorder).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <ddp/comm/error.h>
#include <ddp/comm/flight_recorder.h>
#include <ddp/comm/process_group_nccl.h>

#include "gpu/gpu_testing.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;
using ddp_gpu_test::keep_stream_busy;
using ddp_gpu_test::message_of;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The part of a dump that describes group `name`: from its header to the
// next group's (groups are written one per line, `\n  {"name": ...`).
std::string group_section(const std::string& dump, const std::string& name) {
  const auto begin = dump.find("{\"name\": \"" + name + "\"");
  if (begin == std::string::npos) {
    return "";
  }
  const auto end = dump.find("\n  {\"name\": ", begin + 1);
  return dump.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

class NcclFlightRecorder : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
    char pattern[] = "/tmp/ddp_nccl_fr_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ::setenv("DDP_FLIGHT_RECORDER_DIR", dir_.c_str(), 1);
    name_ = ddp_gpu_test::fresh_group_name();
    group_ = ProcessGroupNCCL::create(std::make_shared<HashStore>(), 0, 1,
                                      ProcessGroupNCCLOptions().group_name(name_).device_index(0));
  }

  std::string dir_;
  std::string name_;
  std::shared_ptr<ProcessGroupNCCL> group_;
};

TEST_F(NcclFlightRecorder, RecordsEachCollectiveWithItsShapeAndState) {
  auto sum = torch::ones({16}, cuda());
  group_->allreduce(sum)->wait(std::chrono::seconds(60));
  auto ids = torch::arange(4, torch::TensorOptions().dtype(torch::kLong).device(cuda()));
  group_->broadcast(ids)->wait(std::chrono::seconds(60));
  auto gathered = torch::empty({8}, cuda());
  group_->allgather_into_tensor(gathered, torch::ones({8}, cuda()))->wait(std::chrono::seconds(60));

  const auto path = dump_flight_recorder("nccl flight recorder test");
  ASSERT_EQ(path, dir_ + "/rank_0.json");
  const auto dump = read_file(path);
  EXPECT_NE(dump.find("\"reason\": \"nccl flight recorder test\""), std::string::npos) << dump;
  const auto section = group_section(dump, name_);
  ASSERT_FALSE(section.empty()) << "no group " << name_ << " in\n" << dump;
  EXPECT_NE(section.find("\"backend\": \"nccl\""), std::string::npos) << section;
  EXPECT_NE(section.find("\"seq\": 0, \"op\": \"allreduce\""), std::string::npos) << section;
  EXPECT_NE(section.find("\"seq\": 1, \"op\": \"broadcast\""), std::string::npos) << section;
  EXPECT_NE(section.find("\"seq\": 2, \"op\": \"allgather_into_tensor\""), std::string::npos) << section;
  EXPECT_NE(section.find("float32[16]"), std::string::npos) << section;
  EXPECT_NE(section.find("int64[4]"), std::string::npos) << section;
  EXPECT_EQ(count(section, "\"state\": \"completed\""), 3u) << section;
}

TEST_F(NcclFlightRecorder, WaitThatTimesOutOnTheGpuWritesTheDump) {
  group_->allreduce(torch::ones({1}, cuda()))->wait(std::chrono::seconds(60)); // the communicator
  auto tensor = torch::ones({32}, cuda());
  keep_stream_busy(std::chrono::milliseconds(2000));
  auto work = group_->allreduce(tensor);
  auto message = message_of<TimeoutError>([&] { work->wait(std::chrono::milliseconds(100)); });
  EXPECT_NE(message.find("allreduce #1: wait timed out after 100 ms"), std::string::npos) << message;

  // Written before the caller saw the error: the operation is still on the GPU.
  const auto dump = read_file(dir_ + "/rank_0.json");
  ASSERT_FALSE(dump.empty()) << "no dump in " << dir_ << " after a wait() timed out";
  EXPECT_NE(dump.find("wait timed out after 100 ms"), std::string::npos) << dump;
  const auto section = group_section(dump, name_);
  EXPECT_NE(section.find("\"seq\": 1, \"op\": \"allreduce\", \"shape\": \"float32[32]"),
            std::string::npos)
      << section;
  EXPECT_EQ(count(section, "\"state\": \"completed\""), 1u) << section;
  EXPECT_EQ(count(section, "\"state\": \"started\""), 1u) << section;

  work->wait(std::chrono::seconds(30)); // the group's deadline has not passed
  EXPECT_TRUE(work->is_success());
}

} // namespace
} // namespace ddp
