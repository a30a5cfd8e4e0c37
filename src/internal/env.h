#pragma once

// Every environment variable the library reads, declared once with its
// default and what it does (NCCL's NCCL_PARAM idea). Code reads variables only
// through these declarations, so this list is complete by construction.

#include <optional>
#include <string>

namespace ddp::internal {

struct EnvVar {
  const char* name;
  const char* default_value; // nullptr: no default, the variable is optional
  const char* doc;
};

// Rendezvous (torchrun's names; ddprun sets all of them).
inline constexpr EnvVar kEnvRank{"RANK", nullptr, "Global rank of this process."};
inline constexpr EnvVar kEnvWorldSize{"WORLD_SIZE", nullptr, "Number of processes in the job."};
inline constexpr EnvVar kEnvLocalRank{"LOCAL_RANK", nullptr, "Rank of this process on its node; picks the GPU."};
inline constexpr EnvVar kEnvLocalWorldSize{"LOCAL_WORLD_SIZE", nullptr, "Number of processes on this node."};
inline constexpr EnvVar kEnvMasterAddr{"MASTER_ADDR", nullptr, "Host of rank 0's TCP store."};
inline constexpr EnvVar kEnvMasterPort{"MASTER_PORT", nullptr, "Port of rank 0's TCP store."};
// Slurm, used when RANK/WORLD_SIZE are absent.
inline constexpr EnvVar kEnvSlurmProcId{"SLURM_PROCID", nullptr, "Slurm's global rank."};
inline constexpr EnvVar kEnvSlurmNTasks{"SLURM_NTASKS", nullptr, "Slurm's world size."};
inline constexpr EnvVar kEnvSlurmLocalId{"SLURM_LOCALID", nullptr, "Slurm's local rank."};
inline constexpr EnvVar kEnvSlurmNTasksPerNode{"SLURM_NTASKS_PER_NODE", nullptr, "Slurm's local world size."};
// Open MPI, used when neither torchrun's nor Slurm's variables are set.
inline constexpr EnvVar kEnvOmpiRank{"OMPI_COMM_WORLD_RANK", nullptr, "Open MPI's global rank."};
inline constexpr EnvVar kEnvOmpiSize{"OMPI_COMM_WORLD_SIZE", nullptr, "Open MPI's world size."};
inline constexpr EnvVar kEnvOmpiLocalRank{"OMPI_COMM_WORLD_LOCAL_RANK", nullptr, "Open MPI's local rank."};
inline constexpr EnvVar kEnvOmpiLocalSize{"OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, "Open MPI's local world size."};
// Networking.
inline constexpr EnvVar kEnvSocketIfname{"DDP_SOCKET_IFNAME", nullptr,
    "Network interface Gloo binds to (e.g. eth0). Default: the interface that reaches MASTER_ADDR."};
inline constexpr EnvVar kEnvGlooSocketIfname{"GLOO_SOCKET_IFNAME", nullptr,
    "PyTorch's name for DDP_SOCKET_IFNAME; read when DDP_SOCKET_IFNAME is unset."};
// Diagnostics.
inline constexpr EnvVar kEnvDebug{"DDP_DEBUG", "0",
    "1: rank 0 prints DDP's per-iteration insight figures and bucket layout."};

// The variable's value, or its default, or nullopt when unset with no default.
std::optional<std::string> env_get(const EnvVar& var);

} // namespace ddp::internal
