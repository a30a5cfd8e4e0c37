// Note [Launcher precedence]
// A process can see several launchers' variables at once, and only one of
// them describes the ranks of this job (world_info_from_env, init.cpp):
//   1. RANK and WORLD_SIZE: torchrun or ddprun started it, inside a Slurm
//      allocation or not;
//   2. OMPI_COMM_WORLD_RANK and _SIZE: mpirun started it. Inside an
//      allocation (an sbatch script, salloc) Slurm's variables are there too,
//      inherited from the batch step: they describe the allocation, not the
//      MPI ranks, so Open MPI's come first;
//   3. SLURM_PROCID and SLURM_NTASKS, only in an srun step (SLURM_STEP_ID
//      set to an ordinary step number). In the batch script or salloc's
//      shell they describe the allocation: a program run there directly is
//      one process, and with SLURM_NTASKS > 1 it would wait for ranks that
//      nobody starts, so init_process_group says how to start them instead.
// Under srun, MASTER_ADDR defaults to the step's first host and
// MASTER_PORT to 15000 + the job id's last 4 digits; set either to choose.

#include "comm/slurm_env.h"

#include <cstdlib>

#include "internal/env.h"

namespace ddp::internal {

namespace {

// Slurm's special step numbers (slurm.h: SLURM_BATCH_SCRIPT 0xfffffffb,
// SLURM_EXTERN_CONT 0xfffffffc, SLURM_INTERACTIVE_STEP 0xfffffffa, ...).
constexpr unsigned long long kFirstSpecialStep = 0xfffffffaULL;

bool whole_number(const std::string& text, unsigned long long& value) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 19) {
    return false;
  }
  value = std::strtoull(text.c_str(), nullptr, 10);
  return true;
}

} // namespace

bool in_srun_step() {
  const auto step = env_get(kEnvSlurmStepId);
  unsigned long long value = 0;
  return step && whole_number(*step, value) && value < kFirstSpecialStep;
}

std::string first_slurm_host(const std::string& hostlist) {
  std::string host;
  for (size_t at = 0; at < hostlist.size();) {
    const char c = hostlist[at];
    if (c == ',') {
      break; // the first entry ends
    }
    if (c == ']') {
      return "";
    }
    if (c != '[') {
      host += c;
      ++at;
      continue;
    }
    // A range list, "01-04,07": its first value.
    const size_t close = hostlist.find(']', at);
    if (close == std::string::npos) {
      return "";
    }
    const std::string ranges = hostlist.substr(at + 1, close - at - 1);
    const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
      return "";
    }
    host += first;
    at = close + 1;
  }
  return host;
}

std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  if (node < 0) {
    return std::nullopt;
  }
  long long first_node = 0;
  size_t at = 0;
  while (at < tasks_per_node.size()) {
    const size_t end = tasks_per_node.find(',', at);
    const std::string item = tasks_per_node.substr(at, end == std::string::npos ? std::string::npos : end - at);
    unsigned long long tasks = 0;
    unsigned long long repeat = 1;
    const size_t paren = item.find("(x");
    if (paren == std::string::npos) {
      if (!whole_number(item, tasks)) {
        return std::nullopt;
      }
    } else if (item.back() != ')' || !whole_number(item.substr(0, paren), tasks) ||
               !whole_number(item.substr(paren + 2, item.size() - paren - 3), repeat)) {
      return std::nullopt;
    }
    if (tasks > 1000000 || repeat > 1000000) {
      return std::nullopt;
    }
    if (node < first_node + static_cast<long long>(repeat)) {
      return static_cast<int>(tasks);
    }
    first_node += static_cast<long long>(repeat);
    if (end == std::string::npos) {
      break;
    }
    at = end + 1;
  }
  return std::nullopt;
}

int slurm_master_port(const std::string& job_id) {
  unsigned long long value = 0;
  if (!whole_number(job_id, value)) {
    return 0;
  }
  return 15000 + static_cast<int>(value % 10000);
}

std::string srun_without_pmix_warning() {
  if (!in_srun_step() || env_get(kEnvPmixRank)) {
    return "";
  }
  const auto type = env_get(kEnvSlurmMpiType);
  return "srun started this task (SLURM_PROCID=" + env_get(kEnvSlurmProcId).value_or("<unset>") +
         ") without PMIx (SLURM_MPI_TYPE=" + type.value_or("<unset>: --mpi=none") +
         "). Open MPI's MPI_Init reaches srun only through PMIx unless it was built with Slurm's "
         "PMI-1/PMI-2 (Debian's is not): if MPI_Init fails below, run srun --mpi=pmix (srun "
         "--mpi=list shows the plugins), or set MpiDefault=pmix in slurm.conf";
}

} // namespace ddp::internal
