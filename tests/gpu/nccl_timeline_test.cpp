// The step timeline (Note [Timeline]) of DDP on CUDA over an NCCL group of
// one rank, its buckets allreduced by a communication hook: the file DDP_TRACE_DIR/trace_rank_0.json holds the DDP step's
// forward and backward, the buckets, and the NCCL group's collectives on
// their own track, each span closed (the watchdog saw its end event). The
// Gloo case, an MNIST job on 2 ranks, is tests/timeline/run_trace_test.sh.
// Its own program: the timeline reads DDP_TRACE_DIR once per process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ddp/comm/process_group_nccl.h>
#include <ddp/ddp.h>
#include <ddp/store/hash_store.h>
#include <ddp/timeline.h>

#include "gpu/gpu_testing.h"

namespace ddp {
namespace {

using ddp_gpu_test::cuda;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The durations of the complete ("X") events whose name matches the regular
// expression `name`.
std::vector<int64_t> durations_of(const std::string& trace, const std::string& name) {
  const std::regex event("\\{\"name\": \"" + name + "\", \"ph\": \"X\", \"ts\": [0-9]+, \"dur\": (-?[0-9]+)");
  std::vector<int64_t> found;
  for (auto it = std::sregex_iterator(trace.begin(), trace.end(), event); it != std::sregex_iterator(); ++it) {
    found.push_back(std::stoll((*it)[1].str()));
  }
  return found;
}

TEST(NcclTimeline, DdpStepsOnTheGpuAreTraced) {
  DDP_REQUIRE_GPUS(1);
  char pattern[] = "/tmp/ddp_nccl_trace_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ::setenv("DDP_TRACE_DIR", dir.c_str(), 1);
  ASSERT_TRUE(timeline_enabled());

  const std::string group_name = "timeline-test";
  auto group = ProcessGroupNCCL::create(std::make_shared<HashStore>(), 0, 1,
                                        ProcessGroupNCCLOptions().group_name(group_name).device_index(0));
  torch::manual_seed(0);
  auto net = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  net->to(cuda());
  DistributedDataParallel model(net, DistributedDataParallelOptions()
                                         .process_group(group)
                                         .bucket_cap_mb(0.0001) // several buckets
                                         .first_bucket_cap_mb(0.0001));
  // With one rank DDP sends nothing (the mean of one gradient is itself);
  // this hook allreduces each bucket anyway, as PyTorch's DDP does, so that
  // the NCCL group has collectives to trace.
  model->register_comm_hook([](ProcessGroup& g, GradBucket& bucket) { return g.allreduce(bucket.buffer()); });
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    torch::mse_loss(model(torch::randn({6, 8}, cuda())), torch::randn({6, 4}, cuda())).backward();
    {
      TimelineScope scope("optimizer step", "optimizer");
      optimizer.step();
    }
  }
  torch::cuda::synchronize();
  // The watchdog closes a collective's span once its end event has passed.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  const std::string path = write_timeline();
  ASSERT_EQ(path, dir + "/trace_rank_0.json");
  const std::string trace = read_file(path);
  EXPECT_NE(trace.find("\"schema\": \"ddp-timeline\""), std::string::npos) << trace;
  EXPECT_NE(trace.find("\"args\": {\"name\": \"collectives: " + group_name + " (nccl)\"}"),
            std::string::npos)
      << trace;
  // A collective's span is named by its operation and the caller's label,
  // as in the flight recorder.
  const std::string allreduce = "allreduce \\(DDP gradient bucket [01]\\)";
  for (const std::string& name : {std::string("forward"), std::string("backward"), std::string("bucket 0"),
                                  std::string("bucket 1"), allreduce, std::string("optimizer step")}) {
    const auto durations = durations_of(trace, name);
    EXPECT_GE(durations.size(), static_cast<size_t>(name == "bucket 1" ? 1 : kSteps - 1))
        << "'" << name << "' spans in\n"
        << trace;
    for (const auto d : durations) {
      EXPECT_GE(d, 0) << name;
    }
  }
  EXPECT_EQ(trace.find("\"state\": \"started\""), std::string::npos) << "an allreduce left open:\n" << trace;
  EXPECT_NE(trace.find("\"state\": \"completed\""), std::string::npos) << trace;
}

} // namespace
} // namespace ddp
