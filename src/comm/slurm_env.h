#pragma once

// What init_process_group needs of Slurm's environment (private header):
// whether this process is a task of an srun step, its node's task count,
// and the rendezvous address and port derived from the job. See Note
// [Launcher precedence] in slurm_env.cpp.

#include <optional>
#include <string>

namespace ddp::internal {

// Whether SLURM_STEP_ID says this process is a task of an srun step: set,
// and not one of Slurm's special steps (batch script, extern, interactive).
bool in_srun_step();

// The first host of a Slurm hostlist: "node[01-04,07],gpu5" -> "node01",
// "rack[2-3]-n[7,9]" -> "rack2-n7". "" when it cannot be read.
std::string first_slurm_host(const std::string& hostlist);

// The tasks on node `node` (from 0) in SLURM_STEP_TASKS_PER_NODE's form,
// "2(x3),1": 2 on nodes 0-2, 1 on node 3. nullopt when malformed or when
// `node` is past its end.
std::optional<int> slurm_tasks_on_node(const std::string& tasks_per_node, int node);

// The port derived from a Slurm job id when MASTER_PORT is unset: 15000 plus
// the id's last 4 digits (PyTorch Lightning's convention), so in
// [15000, 24999]; 0 when `job_id` is not a number.
int slurm_master_port(const std::string& job_id);

// Before MPI_Init in an srun step that srun started without PMIx
// (--mpi=pmi2 or none): what to do if MPI_Init fails, which it does with
// an Open MPI built with PMIx only, as Debian's is. "" elsewhere.
std::string srun_without_pmix_warning();

} // namespace ddp::internal
