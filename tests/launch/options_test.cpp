// ddprun's command line and the environment it gives each rank, tested in
// process (the launcher's behaviour as a process is in ddprun_test.cpp).

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "launch/options.h"

namespace ddp::launch {
namespace {

using Args = std::vector<std::string>;

LaunchOptions parse(const Args& args) {
  CommandLine command_line = parse_command_line(args);
  EXPECT_FALSE(command_line.help);
  return command_line.options;
}

std::map<std::string, std::string> as_map(
    const std::vector<std::pair<std::string, std::string>>& env) {
  std::map<std::string, std::string> map;
  for (const auto& [name, value] : env) {
    EXPECT_TRUE(map.emplace(name, value).second) << name << " is set twice";
  }
  return map;
}

TEST(ParseCommandLineTest, Defaults) {
  LaunchOptions options = parse({"--nproc-per-node", "4", "./train"});
  EXPECT_EQ(options.nproc_per_node, 4);
  EXPECT_EQ(options.nnodes, 1);
  EXPECT_EQ(options.node_rank, 0);
  EXPECT_EQ(options.master_addr, "127.0.0.1");
  EXPECT_FALSE(options.master_port.has_value());
  EXPECT_TRUE(options.prefix_output);
  EXPECT_EQ(options.grace_period, std::chrono::seconds(5));
  EXPECT_EQ(options.max_restarts, 0);
  EXPECT_EQ(options.program, Args{"./train"});
}

TEST(ParseCommandLineTest, TorchrunSpellingsAndInlineValues) {
  const Args spellings[] = {
      {"--nproc-per-node", "2", "--nnodes", "3", "--node-rank", "2", "--master-addr", "node0",
       "--master-port", "29500", "--grace-period", "1.5", "--no-prefix", "prog"},
      {"--nproc_per_node", "2", "--nnodes", "3", "--node_rank", "2", "--master_addr", "node0",
       "--master_port", "29500", "--grace_period", "1.5", "--no_prefix", "prog"},
      {"--nproc-per-node=2", "--nnodes=3", "--node_rank=2", "--master-addr=node0",
       "--master_port=29500", "--grace-period=1.5", "--no-prefix", "prog"},
      // --max-restarts needs one node; here it is 0, which any job may give.
      {"--nproc-per-node=2", "--nnodes=3", "--node_rank=2", "--master-addr=node0",
       "--master_port=29500", "--grace-period=1.5", "--no-prefix", "--max_restarts=0", "prog"},
  };
  for (const Args& args : spellings) {
    SCOPED_TRACE(::testing::PrintToString(args));
    LaunchOptions options = parse(args);
    EXPECT_EQ(options.nproc_per_node, 2);
    EXPECT_EQ(options.nnodes, 3);
    EXPECT_EQ(options.node_rank, 2);
    EXPECT_EQ(options.master_addr, "node0");
    EXPECT_EQ(options.master_port, 29500);
    EXPECT_EQ(options.grace_period, std::chrono::milliseconds(1500));
    EXPECT_FALSE(options.prefix_output);
    EXPECT_EQ(options.program, Args{"prog"});
  }
}

TEST(ParseCommandLineTest, MaxRestartsInTorchrunsSpellings) {
  for (const Args& args : {Args{"--nproc-per-node", "2", "--max-restarts", "3", "prog"},
                           Args{"--nproc-per-node", "2", "--max_restarts", "3", "prog"},
                           Args{"--nproc-per-node", "2", "--max-restarts=3", "prog"},
                           Args{"--max_restarts=3", "--nproc-per-node", "2", "prog"}}) {
    SCOPED_TRACE(::testing::PrintToString(args));
    EXPECT_EQ(parse(args).max_restarts, 3);
  }
  EXPECT_EQ(parse({"--nproc-per-node", "1", "--max-restarts", "0", "prog"}).max_restarts, 0);
  // A fixed port is allowed: every attempt reuses it once the last one is gone.
  EXPECT_EQ(parse({"--nproc-per-node", "1", "--master-port", "29500", "--max-restarts", "1",
                   "prog"})
                .max_restarts,
            1);
}

TEST(ParseCommandLineTest, ProgramArgumentsAreNotOptions) {
  // Everything from the program on is the program's, even what looks like ours.
  EXPECT_EQ(parse({"--nproc-per-node", "1", "prog", "--nnodes", "5", "--", "-h"}).program,
            (Args{"prog", "--nnodes", "5", "--", "-h"}));
  // `--` ends our options, so that a program may start with a dash.
  EXPECT_EQ(parse({"--nproc-per-node", "1", "--", "-weird", "--no-prefix"}).program,
            (Args{"-weird", "--no-prefix"}));
}

TEST(ParseCommandLineTest, Help) {
  EXPECT_TRUE(parse_command_line({"--help"}).help);
  EXPECT_TRUE(parse_command_line({"-h"}).help);
  // Help wins over whatever else is wrong on the line.
  EXPECT_TRUE(parse_command_line({"--nnodes", "2", "-h"}).help);
  EXPECT_NE(std::string(usage_text()).find("--nproc-per-node"), std::string::npos);
}

TEST(ParseCommandLineTest, Analyze) {
  // Starts nothing: no --nproc-per-node, no program.
  const CommandLine line = parse_command_line({"--analyze", "/tmp/fr"});
  ASSERT_TRUE(line.analyze.has_value());
  EXPECT_EQ(*line.analyze, "/tmp/fr");
  EXPECT_FALSE(line.help);
  EXPECT_EQ(*parse_command_line({"--analyze=dumps"}).analyze, "dumps");
  EXPECT_FALSE(parse_command_line({"--nproc-per-node", "2", "prog"}).analyze.has_value());
  EXPECT_NE(std::string(usage_text()).find("--analyze DIR"), std::string::npos);
}

TEST(ParseCommandLineTest, Trace) {
  const CommandLine line = parse_command_line({"--nproc-per-node", "2", "--trace", "/tmp/tl", "prog"});
  ASSERT_TRUE(line.options.trace_dir.has_value());
  EXPECT_EQ(*line.options.trace_dir, "/tmp/tl");
  EXPECT_FALSE(parse_command_line({"--nproc-per-node", "2", "prog"}).options.trace_dir.has_value());
  // --merge-trace starts nothing, as --analyze.
  const CommandLine merge = parse_command_line({"--merge-trace=/tmp/tl"});
  ASSERT_TRUE(merge.merge_trace.has_value());
  EXPECT_EQ(*merge.merge_trace, "/tmp/tl");
  EXPECT_NE(std::string(usage_text()).find("--trace DIR"), std::string::npos);
  EXPECT_NE(std::string(usage_text()).find("--merge-trace DIR"), std::string::npos);
}

TEST(ParseCommandLineTest, Plan) {
  // --plan starts no job: --nproc-per-node is optional and gives the ranks per node.
  const CommandLine line = parse_command_line({"--plan", "2,8,1024", "--plan-variant", "fsdp=--parallel fsdp",
                                               "--plan-variant=ddp= --parallel  ddp ", "--plan-rank", "3",
                                               "--plan-dir", "/tmp/p", "prog", "--steps", "1"});
  ASSERT_TRUE(line.plan.has_value());
  EXPECT_EQ(line.plan->world_sizes, (std::vector<int>{2, 8, 1024}));
  ASSERT_EQ(line.plan->variants.size(), 2u);
  EXPECT_EQ(line.plan->variants[0].first, "fsdp");
  EXPECT_EQ(line.plan->variants[0].second, (Args{"--parallel", "fsdp"}));
  EXPECT_EQ(line.plan->variants[1].first, "ddp");
  EXPECT_EQ(line.plan->variants[1].second, (Args{"--parallel", "ddp"}));
  EXPECT_EQ(line.plan->rank, 3);
  EXPECT_EQ(line.plan->directory, "/tmp/p");
  EXPECT_FALSE(line.plan->ranks_per_node.has_value());
  EXPECT_EQ(line.options.program, (Args{"prog", "--steps", "1"}));
  const CommandLine per_node = parse_command_line({"--nproc-per-node", "8", "--plan", "64", "prog"});
  EXPECT_EQ(per_node.plan->ranks_per_node, 8);
  EXPECT_TRUE(per_node.plan->variants.empty());
  EXPECT_FALSE(parse_command_line({"--nproc-per-node", "2", "prog"}).plan.has_value());
  EXPECT_NE(std::string(usage_text()).find("--plan SIZES"), std::string::npos);
}

struct BadCommandLine {
  Args args;
  std::string expected; // a substring of the error: the bad value, echoed
};

void PrintTo(const BadCommandLine& bad, std::ostream* os) {
  *os << ::testing::PrintToString(bad.args);
}

class BadCommandLineTest : public ::testing::TestWithParam<BadCommandLine> {};

TEST_P(BadCommandLineTest, ThrowsUsageErrorNamingTheValue) {
  try {
    parse_command_line(GetParam().args);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().expected), std::string::npos)
        << "error: " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    ParseCommandLineTest,
    BadCommandLineTest,
    ::testing::Values(
        BadCommandLine{{"prog"}, "--nproc-per-node is required"},
        BadCommandLine{{"--analyze", ""}, "--analyze needs a directory (got '')"},
        BadCommandLine{{"--analyze", "dir", "prog"}, "no program after it (got 'prog')"},
        BadCommandLine{{"--analyze"}, "--analyze needs a value"},
        BadCommandLine{{"--nproc-per-node", "2", "--trace", "", "prog"}, "--trace needs a directory (got '')"},
        BadCommandLine{{"--merge-trace", "dir", "prog"}, "--merge-trace starts nothing: no program after it"},
        BadCommandLine{{"--merge-trace", "a", "--analyze", "b"}, "two commands"},
        BadCommandLine{{"--plan", "2,x", "prog"}, "'x' is not one"},
        BadCommandLine{{"--plan", "0", "prog"}, "'0' is not one"},
        BadCommandLine{{"--plan", "2,,8", "prog"}, "'' is not one"},
        BadCommandLine{{"--plan", "2000000", "prog"}, "from 1 to 1048576"},
        BadCommandLine{{"--plan", "2"}, "--plan: missing the program"},
        BadCommandLine{{"--plan-variant", "a=--x", "prog"}, "go with --plan SIZES"},
        BadCommandLine{{"--plan", "2", "--plan-variant", "--parallel fsdp", "prog"}, "NAME=ARGS"},
        BadCommandLine{{"--plan", "2", "--plan-variant", "a/b=x", "prog"}, "NAME=ARGS"},
        BadCommandLine{{"--plan", "2", "--plan-dir", "", "prog"}, "--plan-dir needs a directory"},
        BadCommandLine{{"--nproc-per-node", "0", "prog"}, "(got '0')"},
        BadCommandLine{{"--nproc-per-node", "-3", "prog"}, "(got '-3')"},
        BadCommandLine{{"--nproc-per-node", "two", "prog"}, "(got 'two')"},
        BadCommandLine{{"--nproc-per-node", "2x", "prog"}, "(got '2x')"},
        BadCommandLine{{"--nproc-per-node", "", "prog"}, "(got '')"},
        BadCommandLine{{"--nproc-per-node"}, "--nproc-per-node needs a value"},
        BadCommandLine{{"--nproc-per-node", "2"}, "missing the program"},
        BadCommandLine{{"--nproc-per-node", "2", "--"}, "missing the program"},
        BadCommandLine{{"--nproc-per-node", "1", "--nnodes", "0", "p"}, "(got '0')"},
        BadCommandLine{{"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "2",
                        "--master-port", "29500", "p"},
                       "--node-rank 2 with --nnodes 2"},
        BadCommandLine{{"--nproc-per-node", "1", "--nnodes", "2", "p"},
                       "--master-port is required when --nnodes is 2"},
        BadCommandLine{{"--nproc-per-node", "1", "--master-port", "0", "p"}, "(got '0')"},
        BadCommandLine{{"--nproc-per-node", "1", "--master-port", "65536", "p"},
                       "(got '65536')"},
        BadCommandLine{{"--nproc-per-node", "1", "--grace-period", "-1", "p"}, "(got '-1')"},
        BadCommandLine{{"--nproc-per-node", "1", "--grace-period", "soon", "p"},
                       "(got 'soon')"},
        BadCommandLine{{"--nproc-per-node", "1", "--grace-period", "nan", "p"}, "(got 'nan')"},
        BadCommandLine{{"--nproc-per-node", "1", "--max-restarts", "-1", "p"}, "(got '-1')"},
        BadCommandLine{{"--nproc-per-node", "1", "--max-restarts", "many", "p"},
                       "--max-restarts must be an integer >= 0 (got 'many')"},
        BadCommandLine{{"--nproc-per-node", "1", "--max-restarts"},
                       "--max-restarts needs a value"},
        BadCommandLine{{"--nproc-per-node", "1", "--nnodes", "2", "--master-port", "29500",
                        "--max-restarts", "1", "p"},
                       "--max-restarts needs --nnodes 1 (got --max-restarts 1 with --nnodes 2)"},
        BadCommandLine{{"--nproc-per-node", "1", "--master-addr", "", "p"}, "(got '')"},
        BadCommandLine{{"--nproc-per-node", "1", "--no-prefix=yes", "p"}, "(got 'yes')"},
        BadCommandLine{{"--nproc-per-node", "1", "--bogus", "p"}, "unknown option '--bogus'"},
        BadCommandLine{{"-n", "1", "p"}, "unknown option '-n'"},
        BadCommandLine{{"--nproc-per-node", "65536", "--nnodes", "65536", "--master-port", "1",
                        "p"},
                       "65536 x 65536"}));

TEST(EnvFlagTest, OnlySetNonZeroValuesCount) {
  EXPECT_FALSE(env_flag_is_set(nullptr));
  EXPECT_FALSE(env_flag_is_set(""));
  EXPECT_FALSE(env_flag_is_set("0"));
  EXPECT_TRUE(env_flag_is_set("1"));
  EXPECT_TRUE(env_flag_is_set("yes"));
}

TEST(RankEnvironmentTest, SingleNode) {
  LaunchOptions options = parse({"--nproc-per-node", "3", "prog"});
  options.master_port = 1234; // as run_ranks does after picking a free port
  for (int local_rank = 0; local_rank < 3; ++local_rank) {
    auto env = as_map(rank_environment(options, local_rank, /*inherited_omp_num_threads=*/nullptr));
    EXPECT_EQ(env, (std::map<std::string, std::string>{
                       {"RANK", std::to_string(local_rank)},
                       {"WORLD_SIZE", "3"},
                       {"LOCAL_RANK", std::to_string(local_rank)},
                       {"LOCAL_WORLD_SIZE", "3"},
                       {"GROUP_RANK", "0"},
                       {"MASTER_ADDR", "127.0.0.1"},
                       {"MASTER_PORT", "1234"},
                       {"OMP_NUM_THREADS", "1"},
                   }));
  }
}

TEST(RankEnvironmentTest, SecondOfThreeNodes) {
  LaunchOptions options = parse({"--nproc-per-node", "4", "--nnodes", "3", "--node-rank", "1",
                                 "--master-addr", "10.0.0.7", "--master-port", "29500", "prog"});
  auto env = as_map(rank_environment(options, 2, /*inherited_omp_num_threads=*/nullptr));
  EXPECT_EQ(env["RANK"], "6"); // node_rank * nproc_per_node + local_rank
  EXPECT_EQ(env["WORLD_SIZE"], "12");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.7");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
}

TEST(RankEnvironmentTest, OmpNumThreadsOnlyWhenUnsetAndSeveralRanks) {
  LaunchOptions one = parse({"--nproc-per-node", "1", "--master-port", "1", "prog"});
  EXPECT_EQ(as_map(rank_environment(one, 0, nullptr)).count("OMP_NUM_THREADS"), 0u);
  LaunchOptions two = parse({"--nproc-per-node", "2", "--master-port", "1", "prog"});
  // The user's value is inherited by the ranks with the rest of ddprun's environment.
  EXPECT_EQ(as_map(rank_environment(two, 0, "8")).count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(as_map(rank_environment(two, 0, nullptr)).at("OMP_NUM_THREADS"), "1");
}

TEST(RankEnvironmentTest, NeedsAPort) {
  LaunchOptions options = parse({"--nproc-per-node", "1", "prog"});
  EXPECT_THROW(rank_environment(options, 0, nullptr), std::logic_error);
}

TEST(RestartEnvironmentTest, TorchrunsNameAndOurs) {
  EXPECT_EQ(as_map(restart_environment(0)),
            (std::map<std::string, std::string>{{"TORCHELASTIC_RESTART_COUNT", "0"},
                                                {"DDP_RESTART_COUNT", "0"}}));
  EXPECT_EQ(as_map(restart_environment(2)),
            (std::map<std::string, std::string>{{"TORCHELASTIC_RESTART_COUNT", "2"},
                                                {"DDP_RESTART_COUNT", "2"}}));
}

TEST(PickFreePortTest, ReturnsABindablePort) {
  const int port = pick_free_port("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  // A documentation address (TEST-NET-3, RFC 5737): numeric, so no DNS
  // lookup, and not on any interface here, so bind fails.
  EXPECT_THROW(pick_free_port("203.0.113.1"), std::runtime_error);
}

} // namespace
} // namespace ddp::launch
