#pragma once

/// Starting and ending the default process group: `init_process_group()`.

#include <chrono>
#include <memory>
#include <string>

#include <torch/arg.h>

#include <ddp/comm/process_group.h>
#include <ddp/store/store.h>
#include <ddp/comm/types.h>

namespace ddp {

/// Which communication backend a process group uses.
enum class Backend {
  /// The backend named by the environment variable DDP_BACKEND (gloo, nccl,
  /// mpi or fake) when it is set, so that one binary runs under ddprun with Gloo
  /// and under `DDP_BACKEND=mpi mpirun` with MPI. Otherwise: with NCCL in
  /// this build and a CUDA device present, a `CompositeProcessGroup` of Gloo
  /// for CPU tensors and NCCL for CUDA tensors (PyTorch 2.x's
  /// "cpu:gloo,cuda:nccl"); else Gloo.
  kAuto,
  /// Gloo: CPU tensors (CUDA tensors are staged through host memory).
  kGloo,
  /// NCCL: CUDA tensors, one GPU per process.
  kNccl,
  /// MPI (`ProcessGroupMPI`): the job is started by mpirun or srun, which
  /// give the rank and size; no store and no MASTER_ADDR. In a ddp built
  /// with MPI (`DDP_WITH_MPI`).
  kMpi,
  /// No other process: this one plays rank RANK of WORLD_SIZE
  /// (`FakeProcessGroup`, include/ddp/comm/process_group_fake.h), for
  /// seeing shapes, memory and traffic at any world size in one process.
  /// No MASTER_ADDR, no network; the values it computes are not a real
  /// job's.
  kFake,
};

/// "auto", "gloo", "nccl", "mpi" or "fake".
std::string to_string(Backend backend);

/// Options of `init_process_group`.
/// Example:
/// `ddp::init_process_group(ddp::InitOptions().backend(ddp::Backend::kGloo).timeout(std::chrono::minutes(5)))`
struct InitOptions {
  /// The backend. Default: Backend::kAuto.
  TORCH_ARG(Backend, backend) = Backend::kAuto;
  /// Deadline of rendezvous and the default deadline of every collective.
  /// Default: 30 minutes (kDefaultTimeout), as PyTorch.
  TORCH_ARG(std::chrono::milliseconds, timeout) = kDefaultTimeout;
  /// Name of the group; its keys in the store are prefixed with it, so that
  /// several groups can share one store. Default: "default".
  TORCH_ARG(std::string, group_name) = "default";
};

/// Where this process stands in the job, as read from the environment.
struct WorldInfo {
  /// Global rank. Default: 0.
  int rank = 0;
  /// Number of processes. Default: 1.
  int world_size = 1;
  /// Rank on this node; picks the GPU. Default: 0.
  int local_rank = 0;
  /// Processes on this node. Default: 1.
  int local_world_size = 1;
  /// Host of rank 0's TCP store; empty in a world of size 1 with no launcher.
  std::string master_addr;
  /// Port of rank 0's TCP store; 0 when not set.
  int master_port = 0;
  /// Where the values came from: "torchrun", "slurm", "openmpi" or "none".
  std::string source = "none";
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
/// MASTER_PORT (torchrun's and ddprun's names); when RANK and WORLD_SIZE are
/// absent, Open MPI's OMPI_COMM_WORLD_* (mpirun, inside a Slurm allocation
/// too), then, in an srun step only, Slurm's SLURM_PROCID/SLURM_NTASKS/
/// SLURM_LOCALID, with MASTER_ADDR and MASTER_PORT derived from the job when
/// unset; with none of them, a world of size 1 (docs/launcher.md, "Other
/// launchers"). Throws one `c10::Error` that lists what was found and what
/// is needed when a variable is malformed, out of range or missing
/// (MASTER_ADDR and MASTER_PORT are not needed with DDP_BACKEND=mpi), and
/// one that says how to start the ranks when the process runs in a Slurm
/// batch script or salloc's shell whose SLURM_NTASKS > 1.
WorldInfo world_info_from_env();

/// Creates the default process group from the environment (env://): a
/// TCPStore at MASTER_ADDR:MASTER_PORT served by rank 0, then the backend's
/// rendezvous through it. With the MPI backend (`Backend::kMpi`, or
/// DDP_BACKEND=mpi with `kAuto`), MPI's own world instead, and no store.
/// With no launcher variables set at all, forms a world of size 1 without
/// touching the network, so the same program runs alone. With the fake
/// backend (`Backend::kFake`, or DDP_BACKEND=fake), a `FakeProcessGroup` of
/// rank RANK of WORLD_SIZE and an in-process store. Returns the group,
/// which stays the default until `destroy_process_group()`. Throws if a
/// default group already exists.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

/// Creates the default process group over an explicit `store`.
std::shared_ptr<ProcessGroup> init_process_group(
    std::shared_ptr<Store> store,
    int rank,
    int world_size,
    const InitOptions& options = {});

/// Creates a process group over `store` without making it the default.
std::shared_ptr<ProcessGroup> new_process_group(
    std::shared_ptr<Store> store,
    int rank,
    int world_size,
    const InitOptions& options = {});

/// Ends the default process group: waits (up to its timeout) for queued work,
/// closes its connections and forgets it. Every subgroup that `new_group`
/// made goes first, the same way (include/ddp/group.h): the registry drops
/// them, so a subgroup lives on only while the caller still holds it, and
/// must not be used after its default group is gone. A no-op when none exists.
void destroy_process_group();

/// True between `init_process_group` and `destroy_process_group`.
bool is_initialized();

/// The default process group. Throws a `c10::Error` saying that
/// `init_process_group()` must be called first when there is none.
std::shared_ptr<ProcessGroup> default_process_group();

} // namespace ddp
