// The plan report (include/ddp/plan.h): CPU tensor memory counted from
// init_process_group, DDP's steps cut where its forwards begin, the bytes
// of each step as the fake group counts them, and the report file. The
// comparison with real runs at 2 and 3 ranks: run_plan_test.sh.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <fstream>
#include <sstream>

#include <ddp/ddp.h>

namespace ddp {
namespace {

TEST(PlanReport, FakeRunCountsMemoryAndTheBytesOfEachStep) {
  char directory[] = "/tmp/ddp_plan_test_XXXXXX";
  ASSERT_NE(::mkdtemp(directory), nullptr);
  ::setenv("DDP_BACKEND", "fake", 1);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("DDP_PLAN_REPORT", directory, 1);
  auto group = init_process_group();
  ASSERT_EQ(group->backend_name(), "fake");

  // Memory: a tensor made now is counted while it lives.
  PlanReport before = plan_report();
  EXPECT_TRUE(before.counting_memory);
  EXPECT_EQ(before.rank, 1);
  EXPECT_EQ(before.world_size, 4);
  EXPECT_EQ(before.backend, "fake");
  {
    auto block = torch::empty({1 << 18}); // 1 MiB
    const PlanReport holding = plan_report();
    EXPECT_EQ(holding.tensor_bytes, before.tensor_bytes + (1 << 20));
    EXPECT_GE(holding.peak_tensor_bytes, holding.tensor_bytes);
  }
  EXPECT_EQ(plan_report().tensor_bytes, before.tensor_bytes);

  // DDP: three steps of a model with 1000*100 + 100 + 100*10 + 10 floats
  // of gradients; each step allreduces them all once, and a ring sends
  // 2 (W - 1) / W of them.
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(1000, 100), torch::nn::ReLU(), torch::nn::Linear(100, 10));
  DistributedDataParallel model(net);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  const int64_t gradient_bytes = (1000 * 100 + 100 + 100 * 10 + 10) * 4;
  const int64_t setup_sent = plan_report().setup_bytes_sent;
  EXPECT_GT(setup_sent, 0) << "DDP's construction broadcasts the model";
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    model->forward(torch::randn({8, 1000})).sum().backward();
    optimizer.step();
  }
  const PlanReport report = plan_report();
  EXPECT_TRUE(report.bytes_counted);
  EXPECT_EQ(report.setup_bytes_sent, setup_sent);
  ASSERT_EQ(report.step_bytes_sent.size(), 3u);
  const int64_t per_step_sent = gradient_bytes * 2 * 3 / 4;
  EXPECT_EQ(report.step_bytes_sent[0], per_step_sent);
  // The second step begins with DDP's rebuild of its buckets in the order
  // the gradients came (as PyTorch's): a few bytes of broadcast and allgather.
  EXPECT_GT(report.step_bytes_sent[1], per_step_sent);
  EXPECT_LT(report.step_bytes_sent[1], per_step_sent + 1024);
  EXPECT_EQ(report.step_bytes_sent[2], per_step_sent);
  ASSERT_EQ(report.step_peak_tensor_bytes.size(), 3u);
  for (const int64_t peak : report.step_peak_tensor_bytes) {
    // At least the parameters, their gradients and DDP's bucket.
    EXPECT_GE(peak, 3 * gradient_bytes);
    EXPECT_LE(peak, report.peak_tensor_bytes);
  }
  EXPECT_GE(report.traffic.at("allreduce").bytes_sent, 3 * gradient_bytes * 2 * 3 / 4);
  // The last step's operations one by one: DDP's bucket allreduces.
  int64_t last_step = 0;
  for (const auto& call : report.last_step_calls) {
    EXPECT_EQ(call.op, "allreduce");
    last_step += call.bytes_sent;
  }
  EXPECT_FALSE(report.last_step_calls.empty());
  EXPECT_EQ(last_step, report.step_bytes_sent.back());
  ASSERT_EQ(report.groups.size(), 1u); // the default group's ranks
  EXPECT_EQ(report.groups[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(report.last_step_calls.back().group, 0);

  // A subgroup's operations name its world ranks.
  auto pair = new_group({1, 3});
  auto t = torch::ones({4});
  pair->allreduce(t)->wait();
  const PlanReport with_subgroup = plan_report();
  ASSERT_EQ(with_subgroup.groups.size(), 2u);
  EXPECT_EQ(with_subgroup.groups[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(with_subgroup.last_step_calls.back().group, 1);
  EXPECT_EQ(with_subgroup.last_step_calls.back().bytes_sent, 16); // 2 (2 - 1) / 2 x 16 bytes

  // The file, written by destroy_process_group.
  destroy_process_group();
  std::ifstream file(std::string(directory) + "/plan_rank_1.json");
  ASSERT_TRUE(file.good()) << "no " << directory << "/plan_rank_1.json";
  std::stringstream text;
  text << file.rdbuf();
  // The figures of plan_report() at the end: the subgroup's allreduce
  // counts in the last step.
  EXPECT_EQ(with_subgroup.step_bytes_sent[2], per_step_sent + 16);
  EXPECT_NE(text.str().find("\"step_bytes_sent\": [" + std::to_string(per_step_sent) + ", " +
                            std::to_string(report.step_bytes_sent[1]) + ", " + std::to_string(per_step_sent + 16) +
                            "]"),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("\"last_step_calls\": [[\"allreduce\", " + std::to_string(per_step_sent) + ", " +
                            std::to_string(gradient_bytes) + ", 0], [\"allreduce\", 16, 16, 1]]"),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("\"backend\": \"fake\""), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\"groups\": [[0, 1, 2, 3], [1, 3]]"), std::string::npos) << text.str();
  ::unsetenv("DDP_PLAN_REPORT");
}

} // namespace
} // namespace ddp
