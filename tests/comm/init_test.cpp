// init_process_group(): the environment it reads, the world of size 1, and
// the errors for bad or missing variables.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include <ddp/init.h>

#include "comm/slurm_env.h"
#include "testing/errors.h"

namespace ddp {
namespace {

using ddp::testing::error_of;

const char* const kAllVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_MPI_TYPE", "PMIX_RANK"};

class InitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* var : kAllVars) {
      ::unsetenv(var);
    }
    destroy_process_group();
  }
  void TearDown() override {
    destroy_process_group();
    for (const char* var : kAllVars) {
      ::unsetenv(var);
    }
  }
};

TEST_F(InitTest, NoLauncherVariablesMeanAWorldOfOne) {
  const auto info = world_info_from_env();
  EXPECT_EQ(info.source, "none");
  EXPECT_EQ(info.world_size, 1);

  EXPECT_FALSE(is_initialized());
  auto pg = init_process_group();
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  // Backend::kAuto: Gloo, paired with NCCL for CUDA tensors where this build
  // has NCCL and a GPU is present (PyTorch 2.x's default group).
#ifdef DDP_WITH_NCCL
  const bool with_nccl = torch::cuda::is_available();
#else
  const bool with_nccl = false;
#endif
  EXPECT_EQ(pg->backend_name(), with_nccl ? "cpu:gloo,cuda:nccl" : "gloo");
  EXPECT_EQ(pg->timeout(), std::chrono::minutes(30)); // PyTorch's default
  auto t = torch::arange(5, torch::kFloat);
  pg->allreduce(t)->wait();
  EXPECT_TRUE(torch::equal(t, torch::arange(5, torch::kFloat)));
  pg.reset();
  destroy_process_group();
  EXPECT_FALSE(is_initialized());
}

TEST_F(InitTest, TorchrunVariablesAreRead) {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "10.1.2.3", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  const auto info = world_info_from_env();
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "10.1.2.3");
  EXPECT_EQ(info.master_port, 29511);
}

TEST_F(InitTest, SlurmAndOpenMpiAreUnderstood) {
  ::setenv("SLURM_STEP_ID", "0", 1); // a task of an srun step
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  ::setenv("SLURM_LOCALID", "0", 1);
  ::setenv("MASTER_ADDR", "node1", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  auto info = world_info_from_env();
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 0);
  ::unsetenv("SLURM_PROCID");
  ::unsetenv("SLURM_NTASKS");
  ::unsetenv("SLURM_LOCALID");

  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  info = world_info_from_env();
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.local_rank, 1);
}

// The variables an sbatch -n2 script (the batch step) passes to what it
// runs: they describe the allocation.
void set_batch_step_variables() {
  ::setenv("SLURM_JOB_ID", "4711", 1);
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_LOCALID", "0", 1);
  ::setenv("SLURM_NODEID", "0", 1);
  ::setenv("SLURM_JOB_NODELIST", "node[01-02]", 1);
}

TEST_F(InitTest, MpirunInsideAnAllocationGivesOpenMpisRanks) {
  // sbatch -n2 with `mpirun -np 2 ./program` inside: Slurm's variables are
  // the batch step's, the same on both processes; Open MPI's are the ranks.
  set_batch_step_variables();
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  auto info = world_info_from_env();
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.local_rank, 1); // the GPU: not 0 on both
  EXPECT_EQ(info.local_world_size, 2);
  // Inside an srun step too (srun --mpi=pmix of a program that mpirun
  // would start): Open MPI's variables, where set, agree with Slurm's.
  ::setenv("SLURM_STEP_ID", "0", 1);
  EXPECT_EQ(world_info_from_env().source, "openmpi");
}

TEST_F(InitTest, MpirunInsideAnAllocationWithoutMasterSaysWhatToExport) {
  // Gloo under mpirun needs the rendezvous address, which mpirun does not
  // give; inside an allocation the error shows how to get one.
  set_batch_step_variables();
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  auto what = error_of([] { world_info_from_env(); });
  EXPECT_NE(what.find("the Open MPI environment does not describe a valid world"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_ADDR is not set (needed when OMPI_COMM_WORLD_SIZE > 1; under mpirun or srun, "
                      "DDP_BACKEND=mpi needs none). mpirun in a Slurm allocation: export "
                      "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"),
            std::string::npos)
      << what;
  // The hint once, not again for MASTER_PORT.
  EXPECT_EQ(what.find("mpirun in a Slurm allocation"), what.rfind("mpirun in a Slurm allocation")) << what;
  // Outside an allocation, no Slurm hint.
  ::unsetenv("SLURM_JOB_ID");
  what = error_of([] { world_info_from_env(); });
  EXPECT_EQ(what.find("Slurm"), std::string::npos) << what;
}

TEST_F(InitTest, SrunWithoutPmixIsExplainedBeforeMpiInit) {
  using internal::srun_without_pmix_warning;
  EXPECT_EQ(srun_without_pmix_warning(), ""); // not under srun
  ::setenv("SLURM_STEP_ID", "0", 1);
  ::setenv("SLURM_PROCID", "1", 1);
  ::setenv("SLURM_MPI_TYPE", "pmi2", 1);
  const auto warning = srun_without_pmix_warning();
  EXPECT_NE(warning.find("srun started this task (SLURM_PROCID=1) without PMIx (SLURM_MPI_TYPE=pmi2)"),
            std::string::npos)
      << warning;
  EXPECT_NE(warning.find("run srun --mpi=pmix"), std::string::npos) << warning;
  ::unsetenv("SLURM_MPI_TYPE"); // --mpi=none
  EXPECT_NE(srun_without_pmix_warning().find("(SLURM_MPI_TYPE=<unset>: --mpi=none)"), std::string::npos);
  ::setenv("PMIX_RANK", "0", 1); // srun --mpi=pmix
  EXPECT_EQ(srun_without_pmix_warning(), "");
  ::unsetenv("PMIX_RANK");
  ::setenv("SLURM_STEP_ID", "4294967291", 1); // the batch script
  EXPECT_EQ(srun_without_pmix_warning(), "");
}

TEST_F(InitTest, OutsideAnSrunStepSlurmsTasksAreNotRanks) {
  set_batch_step_variables();
  auto what = error_of([] { world_info_from_env(); });
  EXPECT_NE(what.find("runs in Slurm job 4711 but not in an srun step (SLURM_STEP_ID is unset)"), std::string::npos)
      << what;
  EXPECT_NE(what.find("SLURM_NTASKS=2 counts the allocation's tasks"), std::string::npos) << what;
  EXPECT_NE(what.find("Start the ranks with srun"), std::string::npos) << what;
  // The batch step's own number (SLURM_BATCH_SCRIPT) is not an srun step.
  ::setenv("SLURM_STEP_ID", "4294967291", 1);
  what = error_of([] { world_info_from_env(); });
  EXPECT_NE(what.find("(SLURM_STEP_ID is '4294967291', a batch or interactive step)"), std::string::npos) << what;
  // One task allocated: the program is the whole job, as without Slurm.
  ::setenv("SLURM_NTASKS", "1", 1);
  EXPECT_EQ(world_info_from_env().source, "none");
  // And RANK/WORLD_SIZE say what to do in every case.
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  EXPECT_EQ(world_info_from_env().world_size, 1);
}

TEST_F(InitTest, UnderSrunTheRendezvousComesFromTheJob) {
  ::setenv("SLURM_STEP_ID", "3", 1);
  ::setenv("SLURM_JOB_ID", "1234567", 1);
  ::setenv("SLURM_PROCID", "3", 1);
  ::setenv("SLURM_NTASKS", "5", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_NODEID", "1", 1);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),1", 1);
  ::setenv("SLURM_STEP_NODELIST", "gpu[07-09,12]", 1);
  ::setenv("SLURM_JOB_NODELIST", "gpu[01-12]", 1);
  auto info = world_info_from_env();
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 5);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "gpu07"); // the step's first host
  EXPECT_EQ(info.master_port, 15000 + 4567);
  // Explicit settings win.
  ::setenv("MASTER_ADDR", "10.0.0.9", 1);
  ::setenv("MASTER_PORT", "29400", 1);
  info = world_info_from_env();
  EXPECT_EQ(info.master_addr, "10.0.0.9");
  EXPECT_EQ(info.master_port, 29400);
  // Nothing to derive them from: the error names the variable in play.
  for (const char* var : {"MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                          "SLURM_JOB_ID"}) {
    ::unsetenv(var);
  }
  const auto what = error_of([] { world_info_from_env(); });
  EXPECT_NE(what.find("the Slurm (srun) environment"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_ADDR is not set (needed when SLURM_NTASKS > 1"), std::string::npos) << what;
}

TEST(SlurmEnvTest, HostlistsAndTasksPerNode) {
  using internal::first_slurm_host;
  EXPECT_EQ(first_slurm_host("node01"), "node01");
  EXPECT_EQ(first_slurm_host("node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(first_slurm_host("node[7,3-4]"), "node7");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[07,9]"), "rack2-n07");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("node[01-04"), "");
  EXPECT_EQ(first_slurm_host("node[x]"), "");
  EXPECT_EQ(first_slurm_host("node]"), "");
  using internal::slurm_tasks_on_node;
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("2(x", 0), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("two", 0), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("3", -1), std::nullopt);
  EXPECT_EQ(internal::slurm_master_port("42"), 15042);
  EXPECT_EQ(internal::slurm_master_port("x"), 0);
}

TEST_F(InitTest, BadVariablesGetOneErrorListingFoundAndNeeded) {
  ::setenv("RANK", "abc", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  const auto what = error_of([] { init_process_group(); });
  EXPECT_NE(what.find("Found: "), std::string::npos) << what;
  EXPECT_NE(what.find("RANK='abc' is not an integer"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_ADDR is not set"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_PORT is not set"), std::string::npos) << what;
  EXPECT_NE(what.find("Needed: RANK and WORLD_SIZE"), std::string::npos) << what;
  EXPECT_FALSE(is_initialized());
}

TEST_F(InitTest, RankOutOfRangeAndMissingWorldSize) {
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  auto what = error_of([] { world_info_from_env(); });
  EXPECT_NE(what.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << what;
  EXPECT_NE(what.find("MASTER_PORT=70000 is out of range [1, 65535]"), std::string::npos) << what;

  ::unsetenv("WORLD_SIZE");
  what = error_of([] { world_info_from_env(); });
  EXPECT_NE(what.find("WORLD_SIZE is not set"), std::string::npos) << what;
}

TEST_F(InitTest, DefaultGroupBeforeInitAndDoubleInitAreErrors) {
  auto what = error_of([] { default_process_group(); });
  EXPECT_NE(what.find("call ddp::init_process_group() first"), std::string::npos) << what;
  init_process_group();
  what = error_of([] { init_process_group(); });
  EXPECT_NE(what.find("already exists"), std::string::npos) << what;
}

// Only in a build without NCCL (a build with it has the GPU tests instead):
// compiled out rather than skipped, since a non-GPU test that skips fails
// (ddp_add_gtest in tests/CMakeLists.txt).
#ifndef DDP_WITH_NCCL
TEST_F(InitTest, NcclWithoutNcclBuildSaysSo) {
  const auto what = error_of([] { init_process_group(InitOptions().backend(Backend::kNccl)); });
  EXPECT_NE(what.find("built without the NCCL backend"), std::string::npos) << what;
}
#endif

} // namespace
} // namespace ddp
