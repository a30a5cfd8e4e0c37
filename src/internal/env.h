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
inline constexpr EnvVar kEnvStoreToken{"DDP_STORE_TOKEN", nullptr,
    "Shared secret of ddp's TCPStore (at most 256 bytes), read by its server and its clients "
    "alike: the server refuses a client whose handshake does not carry the same token. Unset or "
    "empty: any client is admitted. TCPStoreOptions::token overrides it."};
// torchrun's elastic agent.
inline constexpr EnvVar kEnvTorchelasticUseAgentStore{"TORCHELASTIC_USE_AGENT_STORE", nullptr,
    "True, true or 1 (torchrun sets True): the launcher's agent already serves a PyTorch "
    "TCPStore at MASTER_ADDR:MASTER_PORT, so every rank connects to it as a client "
    "(TorchTCPStore) instead of rank 0 serving ddp's own TCPStore there."};
inline constexpr EnvVar kEnvTorchelasticRestartCount{"TORCHELASTIC_RESTART_COUNT", "0",
    "torchrun's restart count, which ddprun sets too (--max-restarts): 0 at the first start, k "
    "after the k-th restart of the group. In the agent's store, ddp's keys are under "
    "ddp_cpp/attempt_<count>/, so that a restarted job never reads an earlier attempt's keys."};
// ddprun's own name for it.
inline constexpr EnvVar kEnvRestartCount{"DDP_RESTART_COUNT", "0",
    "Set by ddprun for every rank, with the same value as TORCHELASTIC_RESTART_COUNT: 0 at the "
    "first start, k after the k-th restart (--max-restarts). A program resumes from its last "
    "checkpoint when it is > 0 (examples/mnist does)."};
// Slurm, used in an srun step when neither torchrun's nor Open MPI's
// variables are set (Note [Launcher precedence] in src/comm/slurm_env.cpp).
inline constexpr EnvVar kEnvSlurmProcId{"SLURM_PROCID", nullptr, "Slurm's global rank."};
inline constexpr EnvVar kEnvSlurmNTasks{"SLURM_NTASKS", nullptr,
    "Slurm's number of tasks: the step's under srun, the allocation's in a batch script or salloc."};
inline constexpr EnvVar kEnvSlurmLocalId{"SLURM_LOCALID", nullptr, "Slurm's local rank."};
inline constexpr EnvVar kEnvSlurmNTasksPerNode{"SLURM_NTASKS_PER_NODE", nullptr,
    "Slurm's tasks per node, when the job asked for a fixed number (--ntasks-per-node)."};
inline constexpr EnvVar kEnvSlurmStepTasksPerNode{"SLURM_STEP_TASKS_PER_NODE", nullptr,
    "The srun step's tasks on each node, compressed: \"2(x3),1\" (2 on each of 3 nodes, then 1)."};
inline constexpr EnvVar kEnvSlurmNodeId{"SLURM_NODEID", nullptr, "This node's index in the job, from 0."};
inline constexpr EnvVar kEnvSlurmStepId{"SLURM_STEP_ID", nullptr,
    "Set in the tasks of an srun step (0, 1, ...); unset, or one of Slurm's special step numbers "
    "(4294967290 and up: batch, extern, interactive), in a batch script or salloc's shell."};
inline constexpr EnvVar kEnvSlurmJobId{"SLURM_JOB_ID", nullptr,
    "The Slurm job's id: in an allocation; the source of the derived MASTER_PORT."};
inline constexpr EnvVar kEnvSlurmStepNodeList{"SLURM_STEP_NODELIST", nullptr,
    "The srun step's hosts in Slurm's hostlist syntax (node[01-04,07]); its first is the derived "
    "MASTER_ADDR."};
inline constexpr EnvVar kEnvSlurmJobNodeList{"SLURM_JOB_NODELIST", nullptr,
    "The job's hosts, used when SLURM_STEP_NODELIST is unset."};
inline constexpr EnvVar kEnvSlurmMpiType{"SLURM_MPI_TYPE", nullptr,
    "The MPI plugin of the srun step (srun --mpi, else MpiDefault): pmix, pmi2; unset for none. "
    "Read only to explain an MPI_Init that fails under srun without PMIx."};
inline constexpr EnvVar kEnvPmixRank{"PMIX_RANK", nullptr,
    "Set by srun --mpi=pmix (and by mpirun): the PMIx server Open MPI's MPI_Init needs is there."};
// Open MPI, used when neither torchrun's nor Slurm's variables are set.
inline constexpr EnvVar kEnvOmpiRank{"OMPI_COMM_WORLD_RANK", nullptr, "Open MPI's global rank."};
inline constexpr EnvVar kEnvOmpiSize{"OMPI_COMM_WORLD_SIZE", nullptr, "Open MPI's world size."};
inline constexpr EnvVar kEnvOmpiLocalRank{"OMPI_COMM_WORLD_LOCAL_RANK", nullptr, "Open MPI's local rank."};
inline constexpr EnvVar kEnvOmpiLocalSize{"OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, "Open MPI's local world size."};
// Backend choice.
inline constexpr EnvVar kEnvBackend{"DDP_BACKEND", nullptr,
    "gloo, nccl, mpi or fake: the backend that Backend::kAuto (InitOptions' default) means, so that one "
    "binary runs under ddprun with Gloo and under `DDP_BACKEND=mpi mpirun -np N` with MPI; fake plays "
    "rank RANK of WORLD_SIZE in one process (docs/scaling.md). An "
    "explicit InitOptions::backend wins. Unset or auto: NCCL with Gloo when built with NCCL and a "
    "GPU is present, else Gloo."};
inline constexpr EnvVar kEnvMpiSharedMemoryMinBytes{"DDP_MPI_SHARED_MEMORY_MIN_BYTES", nullptr,
    "The MPI group that init_process_group creates: its shared_memory_min_bytes, the size from "
    "which DDP's buckets go in memory every rank of the node maps (an integer; -1 turns it off). "
    "Unset: ProcessGroupMPIOptions' default, 65536."};
// Networking.
inline constexpr EnvVar kEnvGlooShm{"DDP_GLOO_SHM", "1",
    "1: a Gloo group whose ranks share a host puts large collective buffers (DDP's gradient "
    "buckets, FSDP's shards) in shared memory and reduces them there, without messages (Note "
    "[Shared buffers]); 0: every collective goes through Gloo's TCP connections. Read when a "
    "group is created; a rank with 0 turns it off for its whole group."};
inline constexpr EnvVar kEnvCrossMemory{"DDP_CROSS_MEMORY", "1",
    "1: where a Gloo group shares buffers on one host (DDP_GLOO_SHM), DDP's built-in allreduce "
    "reads each peer's gradients where they lie (Linux cross-memory attach, process_vm_readv) "
    "instead of copying them into the bucket and back (Note [Gradients read where they lie]); "
    "0: the bucket copies. Read when a group first allocates a shared buffer; a rank with 0, or "
    "one that may not read its peers' memory (ptrace rules, seccomp), turns it off for its whole "
    "group."};
inline constexpr EnvVar kEnvFsdpCommonGather{"DDP_FSDP_COMMON_GATHER", "1",
    "1: where FSDP's shard group shares buffers on one host (Gloo or MPI), each unit's gathered "
    "parameters are one buffer that every rank maps, each rank's shard its part of it, and the "
    "all-gather a barrier (Note [Gathered in common memory]); 0: each rank gathers into its own "
    "memory. Read when an FSDP module is made; a rank with 0 turns it off for the whole module."};
inline constexpr EnvVar kEnvSocketIfname{"DDP_SOCKET_IFNAME", nullptr,
    "Network interface Gloo binds to (e.g. eth0). Default: the interface that reaches MASTER_ADDR."};
inline constexpr EnvVar kEnvGlooSocketIfname{"GLOO_SOCKET_IFNAME", nullptr,
    "PyTorch's name for DDP_SOCKET_IFNAME; read when DDP_SOCKET_IFNAME is unset."};
// Diagnostics.
inline constexpr EnvVar kEnvRendezvousProgress{"DDP_RENDEZVOUS_PROGRESS_S", "10",
    "While a rank waits at start-up for the others to join, it says every this many seconds "
    "(and at the deadline) which ranks it still waits for: \"[rank 0/4] init_process_group: "
    "waiting for ranks 1, 3 to join (10 s of 1800 s)\". A positive integer; 0 turns it off."};
inline constexpr EnvVar kEnvFlightRecorderSize{"DDP_FLIGHT_RECORDER_SIZE", "2000",
    "How many of its last collectives each process group's flight recorder keeps (Note [Flight "
    "recorder]); 0 turns it off. A whole number up to 1000000."};
inline constexpr EnvVar kEnvFlightRecorderDir{"DDP_FLIGHT_RECORDER_DIR", nullptr,
    "Where each rank writes its flight recorder dump, rank_<R>.json, when a collective fails, on "
    "SIGUSR1 and on ddp::dump_flight_recorder(). Unset: $TMPDIR/ddp_flight_recorder/<job> (/tmp "
    "when TMPDIR is unset), a folder per job (src/flight_recorder/dump_directory.h names it). "
    "`ddprun --analyze DIR` reads them."};
inline constexpr EnvVar kEnvJobId{"DDP_JOB_ID", nullptr,
    "The job's name, the same on every rank: ddprun sets it for the ranks it starts "
    "(ddprun-<host>-<pid>, or on several nodes the rendezvous' id or address); it names the "
    "job's flight recorder folder and is written in each dump. Unset: torchrun's "
    "TORCHELASTIC_RUN_ID, Slurm's job and step, or the store's address."};
inline constexpr EnvVar kEnvTraceDir{"DDP_TRACE_DIR", nullptr,
    "Turns the timeline on (Note [Timeline]): each rank writes the last steps' events, in the "
    "Chrome Trace Event Format, to trace_rank_<R>.json in this directory when the program exits "
    "(or on ddp::write_timeline()). `ddprun --trace DIR` sets it and merges the ranks' files into "
    "DIR/trace.json and DIR/trace.svg. Unset or empty: no timeline."};
inline constexpr EnvVar kEnvTraceSteps{"DDP_TRACE_STEPS", "20",
    "Which steps the timeline keeps (a step starts at each DistributedDataParallel or "
    "FullyShardedDataParallel forward with gradients): K, the last K steps (a ring, 1 to "
    "100000); or A-B, steps A to B (from 1)."};
inline constexpr EnvVar kEnvPlanReport{"DDP_PLAN_REPORT", nullptr,
    "A directory: each rank counts its CPU tensor memory from init_process_group on and writes "
    "plan_rank_<R>.json there (peak tensor memory, peak resident set, and with the fake backend "
    "the bytes it would have sent before the first step and in each step) at "
    "destroy_process_group() and at exit. `ddprun --plan` sets it (docs/scaling.md). Unset or "
    "empty: no report."};
inline constexpr EnvVar kEnvFakeLink{"DDP_FAKE_LINK", nullptr,
    "With the fake backend: a simulated link, e.g. gbit=1,latency_us=100,per_host=2 (and "
    "cpu_ns_link, cpu_ns_loopback): each operation completes after the time the cost model "
    "prices it at instead of at once, so that a step's time includes its communication and "
    "what overlaps it (Note [A simulated link], docs/scaling.md). Unset or empty: operations "
    "complete at once."};
inline constexpr EnvVar kEnvFakeShm{"DDP_FAKE_SHM", "0",
    "With the fake backend: 1 hands out DDP's buckets and FSDP's buffers as if in memory the "
    "ranks of a host map, where Gloo would (LOCAL_WORLD_SIZE ranks per host, or DDP_FAKE_LINK's "
    "per_host), so that FSDP's units on one host gather in common memory as a real Gloo job's do "
    "(Note [Shared buffers in the fake]); 0: every buffer is private."};
inline constexpr EnvVar kEnvNcclCollectiveCheck{"DDP_NCCL_COLLECTIVE_CHECK", "auto",
    "The NCCL backend's collective fingerprint check (Note [NCCL fingerprint check]): auto (with "
    "two ranks or more), on (with one rank too: what measures its cost on one GPU), off (never; "
    "ranks that call different collectives then hang until the group's timeout)."};
inline constexpr EnvVar kEnvDebug{"DDP_DEBUG", "0",
    "1: rank 0 prints DDP's per-iteration insight figures and bucket layout."};
inline constexpr EnvVar kEnvBacktrace{"DDP_BACKTRACE", "0",
    "1: error messages that ddp prints or quotes (ddp::error_message, the examples) keep the C++ "
    "backtrace of LibTorch's c10::Error; 0: the message alone."};
// Tests only.
inline constexpr EnvVar kEnvTestCheckpointCrashAt{"DDP_TEST_CHECKPOINT_CRASH_AT", nullptr,
    "Tests only: the point of save_checkpoint at which the saving process kills itself with "
    "SIGKILL (begin, optimizer-partial, optimizer-written, model-partial, model-written, "
    "committed, optimizer-renamed; and of save_sharded_checkpoint: sharded-rank-file, "
    "sharded-manifest, sharded-committed; see Note [Checkpoint crash points] in "
    "src/nn/checkpoint_files.h). "
    "Unset: never."};
inline constexpr EnvVar kEnvTestInitExitAt{"DDP_TEST_INIT_EXIT_AT", nullptr,
    "Tests only: <point>:<rank>: that rank leaves the process with _Exit(86) at that point of "
    "init_process_group (store, arrived, gloo-connected, addresses, group; see Note [Start-up "
    "exit points] in src/internal/internal.cpp). Unset: never."};
inline constexpr EnvVar kEnvTestShmKillAt{"DDP_TEST_SHM_KILL_AT", nullptr,
    "Tests only: <point>:<rank>: that rank kills itself with SIGKILL at that point of a "
    "collective on buffers in shared memory (created: its object made, not yet unlinked; "
    "agreed: inside an allreduce, before reducing; see Note [Shared buffers]). Unset: never."};

// The variable's value, or its default, or nullopt when unset with no default.
std::optional<std::string> env_get(const EnvVar& var);

// Tests only: leaves the process at once when DDP_TEST_INIT_EXIT_AT names
// `point` and `rank` (Note [Start-up exit points]).
void init_exit_point(const char* point, int rank);

} // namespace ddp::internal
