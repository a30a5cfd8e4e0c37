#pragma once

// Where flight recorder dumps go (private header; no Torch, so that ddprun
// shares it): one folder per job, so that two jobs on one machine never
// mix their dumps, and `ddprun --analyze` of a folder sees one job.

#include <string>

namespace ddp::flight_recorder {

// The job's name, the same on every rank of the job: DDP_JOB_ID (ddprun
// sets it), else torchrun's TORCHELASTIC_RUN_ID (unless "none", the static
// rendezvous' placeholder), else Open MPI's job (PMIX_NAMESPACE,
// OMPI_MCA_ess_base_jobid), else Slurm's job and step, else the store's
// address (MASTER_ADDR-MASTER_PORT), else this process's id (a process
// alone). Only letters, digits, '.', '_' and '-' (others become '_').
std::string job_name();

// DDP_FLIGHT_RECORDER_DIR when set (as given: the user chose it); else
// $TMPDIR/ddp_flight_recorder/<job_name()> (/tmp without TMPDIR).
std::string dump_directory();

} // namespace ddp::flight_recorder
