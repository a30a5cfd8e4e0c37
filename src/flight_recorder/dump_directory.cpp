#include "flight_recorder/dump_directory.h"

#include <unistd.h>

#include <cstdlib>

namespace ddp::flight_recorder {

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

} // namespace

std::string job_name() {
  std::string job = env("DDP_JOB_ID");
  if (job.empty()) {
    const std::string run = env("TORCHELASTIC_RUN_ID");
    if (!run.empty() && run != "none") {
      job = "torchrun-" + run;
    }
  }
  if (job.empty() && !env("PMIX_NAMESPACE").empty()) {
    job = "mpi-" + env("PMIX_NAMESPACE"); // Open MPI 4 and 5: one per mpirun
  }
  if (job.empty() && !env("OMPI_MCA_ess_base_jobid").empty()) {
    job = "mpi-" + env("OMPI_MCA_ess_base_jobid");
  }
  if (job.empty() && !env("SLURM_JOB_ID").empty()) {
    job = "slurm-" + env("SLURM_JOB_ID") + (env("SLURM_STEP_ID").empty() ? "" : "." + env("SLURM_STEP_ID"));
  }
  if (job.empty() && !env("MASTER_ADDR").empty() && !env("MASTER_PORT").empty()) {
    job = "store-" + env("MASTER_ADDR") + "-" + env("MASTER_PORT");
  }
  if (job.empty()) {
    job = "pid-" + std::to_string(::getpid());
  }
  for (char& c : job) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    c = ok ? c : '_';
  }
  return job;
}

std::string dump_directory() {
  const std::string dir = env("DDP_FLIGHT_RECORDER_DIR");
  if (!dir.empty()) {
    return dir;
  }
  const std::string tmp = env("TMPDIR");
  return (tmp.empty() ? std::string("/tmp") : tmp) + "/ddp_flight_recorder/" + job_name();
}

} // namespace ddp::flight_recorder
