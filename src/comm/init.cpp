// init_process_group(): reading the launcher's environment, creating the
// store and the backend, and keeping the default group.

#include <ddp/init.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ddp/store/hash_store.h>
#include <ddp/comm/process_group_composite.h>
#include <ddp/comm/process_group_fake.h>
#include <ddp/comm/process_group_gloo.h>
#ifdef DDP_WITH_MPI
#include <ddp/comm/process_group_mpi.h>
#endif
#include <ddp/store/prefix_store.h>
#include <ddp/store/tcp_store.h>
#include <ddp/store/torch_tcp_store.h>
#ifdef DDP_WITH_NCCL
#include <ddp/comm/process_group_nccl.h>
#endif

#include <ddp/comm/error.h>

#include "comm/default_group.h"
#include "comm/slurm_env.h"
#include "internal/check.h"
#include "internal/env.h"
#include "internal/logging.h"
#include "plan/plan_recorder.h"

namespace ddp {

std::string to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
    case Backend::kMpi:
      return "mpi";
    case Backend::kFake:
      return "fake";
  }
  return "unknown";
}

namespace {

// Collects what was found and what is wrong, so that one error lists every
// problem at once.
class EnvReport {
 public:
  std::optional<std::string> read(const internal::EnvVar& var) {
    auto value = internal::env_get(var);
    found_.push_back(c10::str(var.name, "=", value ? "'" + *value + "'" : std::string("<unset>")));
    return value;
  }

  // Parses `var` as an integer in [min, max]; records a problem otherwise.
  std::optional<int> read_int(const internal::EnvVar& var, int min, int max, bool required) {
    auto text = read(var);
    if (!text) {
      if (required) {
        problems_.push_back(c10::str(var.name, " is not set"));
      }
      return std::nullopt;
    }
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text->c_str(), &end, 10);
    if (text->empty() || *end != '\0' || errno != 0) {
      problems_.push_back(c10::str(var.name, "='", *text, "' is not an integer"));
      return std::nullopt;
    }
    if (value < min || value > max) {
      problems_.push_back(c10::str(var.name, "=", value, " is out of range [", min, ", ", max, "]"));
      return std::nullopt;
    }
    return static_cast<int>(value);
  }

  void problem(std::string text) {
    problems_.push_back(std::move(text));
  }

  // A value that came from elsewhere than its variable, for the list.
  void derived(std::string text) {
    found_.push_back(std::move(text));
  }

  void throw_if_problems(const std::string& source, const std::string& needed) const {
    if (problems_.empty()) {
      return;
    }
    std::string message = c10::str(
        "init_process_group: the ", source, " environment does not describe a valid world.\n  Found: ");
    for (size_t i = 0; i < found_.size(); ++i) {
      message += (i == 0 ? "" : ", ") + found_[i];
    }
    message += "\n  Problems: ";
    for (size_t i = 0; i < problems_.size(); ++i) {
      message += (i == 0 ? "" : "; ") + problems_[i];
    }
    message += "\n  Needed: " + needed;
    internal::throw_check_error(__func__, __FILE__, __LINE__, message);
  }

 private:
  std::vector<std::string> found_;
  std::vector<std::string> problems_;
};

constexpr int kMaxWorld = 1 << 20;

// The backend that `requested` means: DDP_BACKEND's when `requested` is
// kAuto and the variable names one. Throws when it names none.
Backend resolve_backend(Backend requested) {
  const auto name = internal::env_get(internal::kEnvBackend);
  if (requested != Backend::kAuto || !name || name->empty() || *name == "auto") {
    return requested;
  }
  for (Backend backend : {Backend::kGloo, Backend::kNccl, Backend::kMpi, Backend::kFake}) {
    if (*name == to_string(backend)) {
      return backend;
    }
  }
  DDP_CHECK(false, "init_process_group: DDP_BACKEND='", *name,
            "' names no backend; use gloo, nccl, mpi or fake (or auto, or leave it unset)");
  return requested;
}

// MPI's launcher gives the world itself, and the fake backend meets no one:
// no rendezvous address is needed.
bool env_needs_no_master() {
  const auto name = internal::env_get(internal::kEnvBackend).value_or("");
  return name == "mpi" || name == "fake";
}

// Under srun, what stands in for MASTER_ADDR and MASTER_PORT when they are
// unset (Note [Launcher precedence]); empty and 0 elsewhere.
struct MasterDefaults {
  std::string addr;
  std::string addr_from; // the variable it was read from
  int port = 0;
  // Appended to the problem when MASTER_ADDR or MASTER_PORT is missing.
  std::string hint;
};

void read_master(EnvReport& report, WorldInfo& info, const char* size_name, const MasterDefaults& defaults) {
  auto addr = report.read(internal::kEnvMasterAddr);
  auto port = report.read_int(internal::kEnvMasterPort, 1, 65535, false);
  if ((!addr || addr->empty()) && !defaults.addr.empty()) {
    addr = defaults.addr;
    report.derived(c10::str("MASTER_ADDR from ", defaults.addr_from, ": '", *addr, "'"));
  }
  if (!port && !internal::env_get(internal::kEnvMasterPort) && defaults.port != 0) {
    port = defaults.port;
    report.derived(c10::str("MASTER_PORT from SLURM_JOB_ID: ", *port));
  }
  if (info.world_size > 1 && !env_needs_no_master()) {
    if (!addr || addr->empty()) {
      report.problem(c10::str("MASTER_ADDR is not set (needed when ", size_name,
                              " > 1; under mpirun or srun, DDP_BACKEND=mpi needs none)", defaults.hint));
    }
    if (!port && !internal::env_get(internal::kEnvMasterPort)) {
      report.problem(c10::str("MASTER_PORT is not set (needed when ", size_name, " > 1)",
                              addr && !addr->empty() ? defaults.hint : std::string()));
    }
  }
  info.master_addr = addr.value_or("");
  info.master_port = port.value_or(0);
}

bool any_set(std::initializer_list<const internal::EnvVar*> vars) {
  for (const auto* var : vars) {
    if (internal::env_get(*var)) {
      return true;
    }
  }
  return false;
}

// Reads one launcher's four rank variables.
WorldInfo read_world(const std::string& source, const internal::EnvVar& rank_var,
                     const internal::EnvVar& size_var, const internal::EnvVar& local_rank_var,
                     const internal::EnvVar& local_size_var, const MasterDefaults& defaults = {},
                     std::optional<int> derived_local_size = std::nullopt) {
  EnvReport report;
  WorldInfo info;
  info.source = source;
  auto size = report.read_int(size_var, 1, kMaxWorld, true);
  auto rank = report.read_int(rank_var, 0, kMaxWorld, true);
  if (rank && size && *rank >= *size) {
    report.problem(c10::str(rank_var.name, "=", *rank, " is not below ", size_var.name, "=", *size));
  }
  info.world_size = size.value_or(1);
  info.rank = rank.value_or(0);
  auto local_rank = report.read_int(local_rank_var, 0, kMaxWorld, false);
  auto local_size = report.read_int(local_size_var, 1, kMaxWorld, false);
  if (!local_size && derived_local_size) {
    local_size = derived_local_size;
    report.derived(c10::str("local world size from SLURM_STEP_TASKS_PER_NODE and SLURM_NODEID: ",
                            *local_size));
  }
  // Without the local variables, assume one node.
  info.local_rank = local_rank.value_or(info.rank);
  info.local_world_size = local_size.value_or(info.world_size);
  if (local_rank && local_size && *local_rank >= *local_size) {
    report.problem(c10::str(local_rank_var.name, "=", *local_rank, " is not below ",
                            local_size_var.name, "=", *local_size));
  }
  read_master(report, info, size_var.name, defaults);
  report.throw_if_problems(
      source,
      c10::str(rank_var.name, " and ", size_var.name, " (integers, 0 <= ", rank_var.name, " < ",
               size_var.name, "), and when ", size_var.name,
               " > 1, MASTER_ADDR (rank 0's host) and MASTER_PORT (1-65535). ddprun and torchrun "
               "set all of them; with none of the launcher variables set, the program runs as a "
               "world of size 1."));
  return info;
}

std::mutex& default_group_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::shared_ptr<ProcessGroup>& default_group_slot() {
  static std::shared_ptr<ProcessGroup> group; // guarded by default_group_mutex()
  return group;
}

// How the default group was made (its `group` field is unused: the slot
// above holds the group). Set with the slot, cleared with it.
internal::DefaultGroupContext& default_context_slot() {
  static internal::DefaultGroupContext context; // guarded by default_group_mutex()
  return context;
}

void set_default_context(std::shared_ptr<Store> store, std::string master_addr, Backend backend) {
  auto& context = default_context_slot();
  context.store = std::move(store);
  context.master_addr = std::move(master_addr);
  context.backend = backend;
}

// Note [Re-initialising on one port]
// With env://, rank 0 serves a TCPStore on MASTER_PORT, and a program may
// destroy the default group and create it again on the same port, as often
// as it likes. Nothing orders one rank's destroy after another's: a rank
// quick to destroy and init again could reach rank 0's previous server
// (still serving, or closing), start the new rendezvous there and lose the
// connection when rank 0 closes it; and rank 0 could close its server while
// a slower rank still reads the previous rendezvous's keys. So:
// - every init_process_group() that makes a TCPStore is a numbered *round*
//   of this process (the same count on every rank, as groups are numbered).
//   Rank 0's new server holds the key ddp/env/<round>/open before anyone
//   else can use it, and the other ranks begin the rendezvous only after
//   reading that key, which no earlier round's server has. A connection that
//   an earlier round's server drops under them (a lost connection, or a
//   handshake reset by a listener that is closing) is retried with a fresh
//   client until the deadline;
// - rank 0 owns the server apart from the group (EnvStore) and closes it in
//   destroy_process_group(), even if something still holds the group, but
//   first waits, for a bounded while, until every other rank has set
//   ddp/env/<round>/joined/<rank>, which each does once its rendezvous has
//   returned.
// The listener has SO_REUSEADDR (store/socket.cpp), so that the old
// server's connections in TIME_WAIT do not keep the next one from binding.
struct EnvStore {
  std::unique_ptr<TCPStoreServer> server; // rank 0 only
  std::shared_ptr<TCPStore> store;        // declared after the server: closed before it
  int rank = 0;
  int world_size = 1;
  int round = 0;
  std::chrono::milliseconds timeout{0};
};

// The EnvStore of the default group, when init_process_group() made one.
std::unique_ptr<EnvStore>& env_store_slot() {
  static std::unique_ptr<EnvStore> env_store; // guarded by default_group_mutex()
  return env_store;
}

// How long rank 0's destroy_process_group() keeps serving for ranks still
// in the rendezvous (normally none: each joined long before).
constexpr std::chrono::milliseconds kMaxJoinWait{60000};
// Between two attempts to reach this round's server.
constexpr std::chrono::milliseconds kReconnectPause{20};

std::string env_round_key(int round, const std::string& what) {
  return c10::str("ddp/env/", round, "/", what);
}

// See Note [Re-initialising on one port].
std::unique_ptr<EnvStore> connect_env_store(const WorldInfo& info, std::chrono::milliseconds timeout) {
  static std::atomic<int> rounds{0};
  auto env = std::make_unique<EnvStore>();
  env->rank = info.rank;
  env->world_size = info.world_size;
  env->round = ++rounds;
  env->timeout = timeout;
  const std::string open_key = env_round_key(env->round, "open");
  const auto store_options =
      TCPStoreOptions().port(static_cast<uint16_t>(info.master_port)).timeout(timeout);
  if (info.rank == 0) {
    env->server = std::make_unique<TCPStoreServer>(TCPStoreServerOptions().port(info.master_port));
    env->store = std::make_shared<TCPStore>(info.master_addr, store_options);
    env->store->set(open_key, "1");
    return env;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    try {
      auto store = std::make_shared<TCPStore>(info.master_addr, store_options);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      store->wait({open_key}, std::max(left, std::chrono::milliseconds(0)));
      env->store = std::move(store);
      return env;
    } catch (const TimeoutError& e) {
      throw TimeoutError(c10::str(
          "[rank ", info.rank, "/", info.world_size, "] init_process_group: the store server at ",
          info.master_addr, ":", info.master_port, " did not serve this process's round ",
          env->round, " of init_process_group() in time: rank 0 has not started it (every rank "
          "must call init_process_group() as often as rank 0), or an earlier round's server is "
          "still up there because rank 0 has not called destroy_process_group(). The store "
          "said: ", e.what()));
    } catch (const IoError&) {
      // In the first round there is no earlier server to meet: a real error.
      if (env->round == 1 || std::chrono::steady_clock::now() + kReconnectPause >= deadline) {
        throw;
      }
    }
    std::this_thread::sleep_for(kReconnectPause);
  }
}

// A ProcessGroupMPI over MPI's whole world, or over its ranks `mpi_ranks`
// when not empty. `rank` and `world_size`, when not -1, are what the caller
// expects the group's to be.
std::shared_ptr<ProcessGroup> create_mpi_group(const InitOptions& options, int rank, int world_size,
                                               const std::vector<int>& mpi_ranks = {}) {
  const std::string asked = options.backend() == Backend::kMpi ? "Backend::kMpi" : "DDP_BACKEND=mpi";
#ifdef DDP_WITH_MPI
  auto mpi_options = ProcessGroupMPIOptions().timeout(options.timeout()).ranks(mpi_ranks);
  if (const auto text = internal::env_get(internal::kEnvMpiSharedMemoryMinBytes)) {
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text->c_str(), &end, 10);
    DDP_CHECK(!text->empty() && *end == '\0' && errno == 0 && value >= -1, "init_process_group: ",
              internal::kEnvMpiSharedMemoryMinBytes.name, "='", *text,
              "' is not a byte count (an integer >= 0, or -1 to keep DDP's buckets out of shared "
              "memory)");
    mpi_options.shared_memory_min_bytes(value);
  }
  auto group = ProcessGroupMPI::create(mpi_options);
  DDP_CHECK(rank < 0 || (group->rank() == rank && group->size() == world_size),
            "init_process_group: ", asked, ": the MPI backend's rank and world size are MPI's (rank ",
            group->rank(), " of ", group->size(), "), but rank ", rank, " of ", world_size,
            " was asked for; pass MPI's, or use Backend::kGloo for a group over a store");
  return group;
#else
  DDP_CHECK(false, "init_process_group: ", asked,
            ": this ddp was built without the MPI backend (CMake found no MPI: install an MPI "
            "with its headers, e.g. Debian's libopenmpi-dev, and configure with -DDDP_WITH_MPI=ON); "
            "use the Gloo backend (leave DDP_BACKEND unset) under ddprun or torchrun");
  return nullptr;
#endif
}

// Runs `step` of start-up on rank `rank` of `world_size`; a store or network
// error that does not say which rank it happened on (the store's own
// messages name the store, not the rank) is thrown again, of the same type,
// with "[rank R/W] init_process_group: <stage>: " in front, so that every
// rank's start-up error names it (tests/comm/init_exit_sweep.sh).
template <typename Step>
auto naming_rank(int rank, int world_size, const char* stage, Step step) {
  const auto prefixed = [&](const std::exception& e) {
    return c10::str("[rank ", rank, "/", world_size, "] init_process_group: ", stage, ": ", e.what());
  };
  const auto named = [](const std::exception& e) {
    return std::string(e.what()).rfind("[rank ", 0) == 0;
  };
  try {
    return step();
  } catch (const TimeoutError& e) {
    if (named(e)) {
      throw;
    }
    throw TimeoutError(prefixed(e));
  } catch (const IoError& e) {
    if (named(e)) {
      throw;
    }
    throw IoError(prefixed(e));
  }
}

std::shared_ptr<ProcessGroup> create_group(std::shared_ptr<Store> store, int rank, int world_size,
                                           const InitOptions& options, const std::string& master_addr,
                                           const std::vector<int>& mpi_ranks = {}) {
  Backend backend = resolve_backend(options.backend());
  if (backend == Backend::kMpi) {
    return create_mpi_group(options, rank, world_size, mpi_ranks); // MPI needs no store
  }
  DDP_CHECK(store != nullptr, "init_process_group: the store is null");
  if (backend == Backend::kFake) {
    return FakeProcessGroup::create(rank, world_size, options.timeout());
  }
  const auto make_gloo = [&] {
    return ProcessGroupGloo::create(store, rank, world_size,
                                    ProcessGroupGlooOptions()
                                        .timeout(options.timeout())
                                        .master_addr(master_addr)
                                        .group_name(options.group_name()));
  };
#ifdef DDP_WITH_NCCL
  // The device is the one of the first tensors, or LOCAL_RANK's (see
  // ProcessGroupNCCLOptions::device_index).
  const auto make_nccl = [&] {
    return ProcessGroupNCCL::create(store, rank, world_size,
                                    ProcessGroupNCCLOptions()
                                        .timeout(options.timeout())
                                        .group_name(options.group_name()));
  };
  if (backend == Backend::kAuto && ProcessGroupNCCL::is_available()) {
    // PyTorch 2.x's default, "cpu:gloo,cuda:nccl": CPU tensors keep working
    // on a GPU machine, CUDA tensors get NCCL.
    std::map<c10::DeviceType, std::shared_ptr<ProcessGroup>> backends;
    backends[c10::DeviceType::CPU] = make_gloo();
    backends[c10::DeviceType::CUDA] = make_nccl();
    return std::make_shared<CompositeProcessGroup>(std::move(backends));
  }
  if (backend == Backend::kNccl) {
    return make_nccl();
  }
#else
  if (backend == Backend::kAuto) {
    backend = Backend::kGloo;
  }
  DDP_CHECK(backend != Backend::kNccl, "[rank ", rank, "/", world_size,
            "] init_process_group: this ddp was built without the NCCL backend (it needs a "
            "LibTorch with CUDA and NCCL at build time, see DDP_WITH_NCCL); use Backend::kGloo, "
            "which also accepts CUDA tensors");
#endif
  return make_gloo();
}

// The fake backend's world: RANK and WORLD_SIZE, the rank this process
// plays and the world it plays it in; nothing to meet, so no MASTER_ADDR.
WorldInfo fake_world_from_env() {
  EnvReport report;
  auto size = report.read_int(internal::kEnvWorldSize, 1, kMaxWorld, true);
  auto rank = report.read_int(internal::kEnvRank, 0, kMaxWorld, true);
  if (rank && size && *rank >= *size) {
    report.problem(c10::str("RANK=", *rank, " is not below WORLD_SIZE=", *size));
  }
  report.throw_if_problems("fake backend's",
                           "RANK and WORLD_SIZE (integers, 0 <= RANK < WORLD_SIZE): the rank this process "
                           "plays and the size of the world it plays it in (no MASTER_ADDR: there is no "
                           "one to meet)");
  WorldInfo info;
  info.source = "fake";
  info.world_size = *size;
  info.rank = *rank;
  info.local_rank = info.rank;
  info.local_world_size = info.world_size;
  return info;
}

} // namespace

namespace internal {

DefaultGroupContext default_group_context(const char* op) {
  std::lock_guard<std::mutex> lock(default_group_mutex());
  DDP_CHECK(default_group_slot() != nullptr, op,
            ": no default process group: call ddp::init_process_group() first; subgroups are "
            "made of the default group's ranks and meet through its store");
  DefaultGroupContext context = default_context_slot();
  context.group = default_group_slot();
  return context;
}

std::shared_ptr<ProcessGroup> create_backend_group(std::shared_ptr<Store> store, int rank,
                                                   int world_size, const InitOptions& options,
                                                   const std::string& master_addr,
                                                   const std::vector<int>& mpi_ranks) {
  return create_group(std::move(store), rank, world_size, options, master_addr, mpi_ranks);
}

} // namespace internal

WorldInfo world_info_from_env() {
  using namespace internal;
  if (any_set({&kEnvRank, &kEnvWorldSize})) {
    return read_world("torchrun/ddprun (RANK, WORLD_SIZE)", kEnvRank, kEnvWorldSize, kEnvLocalRank,
                      kEnvLocalWorldSize);
  }
  // Note [Launcher precedence] (slurm_env.cpp): mpirun's ranks before
  // Slurm's, and Slurm's only in an srun step.
  if (any_set({&kEnvOmpiRank, &kEnvOmpiSize})) {
    MasterDefaults defaults;
    if (env_get(kEnvSlurmJobId)) {
      // mpirun passes no rendezvous address, and inside an allocation rank 0
      // need not be on the first node (its --host, --map-by): no guess.
      defaults.hint =
          ". mpirun in a Slurm allocation: export MASTER_ADDR=$(scontrol show hostnames "
          "\"$SLURM_JOB_NODELIST\" | head -n 1) and MASTER_PORT (a free port) before mpirun, or "
          "start the ranks with srun instead (ddp derives both there), or use DDP_BACKEND=mpi";
    }
    auto info = read_world("Open MPI", kEnvOmpiRank, kEnvOmpiSize, kEnvOmpiLocalRank,
                           kEnvOmpiLocalSize, defaults);
    info.source = "openmpi";
    return info;
  }
  if (in_srun_step() && any_set({&kEnvSlurmProcId, &kEnvSlurmNTasks})) {
    MasterDefaults defaults;
    for (const EnvVar* list : {&kEnvSlurmStepNodeList, &kEnvSlurmJobNodeList}) {
      if (const auto hosts = env_get(*list); hosts && defaults.addr.empty()) {
        defaults.addr = first_slurm_host(*hosts);
        defaults.addr_from = list->name;
      }
    }
    defaults.port = slurm_master_port(env_get(kEnvSlurmJobId).value_or(""));
    std::optional<int> local_size;
    const auto tasks_per_node = env_get(kEnvSlurmStepTasksPerNode);
    const auto node = env_get(kEnvSlurmNodeId);
    if (tasks_per_node && node) {
      local_size = slurm_tasks_on_node(*tasks_per_node, std::atoi(node->c_str()));
    }
    auto info = read_world("Slurm (srun)", kEnvSlurmProcId, kEnvSlurmNTasks, kEnvSlurmLocalId,
                           kEnvSlurmNTasksPerNode, defaults, local_size);
    info.source = "slurm";
    return info;
  }
  const auto tasks = env_get(kEnvSlurmNTasks);
  const auto job = env_get(kEnvSlurmJobId);
  const auto step = env_get(kEnvSlurmStepId);
  DDP_CHECK(!job || !tasks || std::atoi(tasks->c_str()) <= 1, "init_process_group: this process runs in Slurm job ",
            *job, " but not in an srun step (SLURM_STEP_ID is ",
            step ? "'" + *step + "', a batch or interactive step" : "unset",
            "): it is the batch script or salloc's shell, where SLURM_NTASKS=", tasks.value_or(""),
            " counts the allocation's tasks, not processes of this program, so no other rank would "
            "join. Start the ranks with srun (srun ./program, each task a rank), mpirun, ddprun or "
            "torchrun; or set RANK=0 and WORLD_SIZE=1 to run this process alone");
  WorldInfo info;
  info.source = "none";
  return info;
}

// Note [Plan report]: the plan report learns who this process is, and with
// the fake backend or DDP_PLAN_REPORT starts counting tensor memory.
namespace {
void note_default_group_for_plan(const ProcessGroup& group) {
  internal::plan_group_created(group.rank(), group.size(), group.backend_name());
}
} // namespace

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  if (resolve_backend(options.backend()) == Backend::kMpi) {
    // mpirun or srun gives the world: no store, no MASTER_ADDR.
    std::lock_guard<std::mutex> lock(default_group_mutex());
    DDP_CHECK(default_group_slot() == nullptr,
              "init_process_group: the default process group already exists; call "
              "ddp::destroy_process_group() before creating another");
    default_group_slot() = create_mpi_group(options, -1, -1);
    set_default_context(nullptr, "", Backend::kMpi);
    note_default_group_for_plan(*default_group_slot());
    return default_group_slot();
  }
  const bool fake = resolve_backend(options.backend()) == Backend::kFake;
  const WorldInfo info = fake ? fake_world_from_env() : world_info_from_env();
  std::shared_ptr<Store> store;
  std::unique_ptr<EnvStore> env_store;
  if (fake || (info.world_size == 1 && info.master_addr.empty())) {
    // Alone: no launcher, a launcher with one rank and no master, or the
    // fake backend, whose other ranks do not exist. Nothing to meet, so no
    // network.
    store = std::make_shared<HashStore>();
  } else if (const auto agent = internal::env_get(internal::kEnvTorchelasticUseAgentStore);
             agent && (*agent == "True" || *agent == "true" || *agent == "1")) {
    // torchrun's agent already serves a PyTorch TCPStore on MASTER_PORT, so
    // rank 0 cannot serve ours there: every rank is a client of the agent's.
    // ddp's keys go under a prefix of their own, so that they meet neither
    // the agent's, nor a torch.distributed program's, nor those of an earlier
    // attempt of a restarted job.
    auto agent_store = std::make_shared<TorchTCPStore>(
        info.master_addr,
        TorchTCPStoreOptions().port(info.master_port).timeout(options.timeout()));
    const auto attempt = internal::env_get(internal::kEnvTorchelasticRestartCount);
    store = std::make_shared<PrefixStore>("ddp_cpp/attempt_" + attempt.value_or("0"),
                                          std::move(agent_store));
  } else {
    // See Note [Re-initialising on one port].
    env_store = naming_rank(info.rank, info.world_size, "connecting to the store",
                            [&] { return connect_env_store(info, options.timeout()); });
    store = env_store->store;
  }
  internal::init_exit_point("store", info.rank);
  std::lock_guard<std::mutex> lock(default_group_mutex());
  DDP_CHECK(default_group_slot() == nullptr,
            "init_process_group: the default process group already exists; call "
            "ddp::destroy_process_group() before creating another");
  default_group_slot() =
      naming_rank(info.rank, info.world_size, "creating the default group",
                  [&] { return create_group(store, info.rank, info.world_size, options, info.master_addr); });
  internal::init_exit_point("group", info.rank);
  set_default_context(store, info.master_addr, resolve_backend(options.backend()));
  note_default_group_for_plan(*default_group_slot());
  if (env_store != nullptr) {
    if (info.rank != 0) {
      // This rank is done with the rendezvous's keys: rank 0 may close the
      // server once every rank has said so.
      try {
        naming_rank(info.rank, info.world_size, "telling rank 0 that this rank has joined", [&] {
          env_store->store->set(env_round_key(env_store->round, c10::str("joined/", info.rank)), "1");
        });
      } catch (const std::exception&) {
        // Rank 0 is gone: nothing can be done with the group. No default
        // group is left behind by a failed init_process_group().
        default_group_slot().reset();
        throw;
      }
    }
    env_store_slot() = std::move(env_store);
  }
  return default_group_slot();
}

std::shared_ptr<ProcessGroup> init_process_group(std::shared_ptr<Store> store, int rank,
                                                 int world_size, const InitOptions& options) {
  std::lock_guard<std::mutex> lock(default_group_mutex());
  DDP_CHECK(default_group_slot() == nullptr,
            "init_process_group: the default process group already exists; call "
            "ddp::destroy_process_group() before creating another");
  default_group_slot() = create_group(store, rank, world_size, options, "");
  set_default_context(resolve_backend(options.backend()) == Backend::kMpi ? nullptr : store, "",
                      resolve_backend(options.backend()));
  note_default_group_for_plan(*default_group_slot());
  return default_group_slot();
}

std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank,
                                                int world_size, const InitOptions& options) {
  return create_group(std::move(store), rank, world_size, options, "");
}

void destroy_process_group() {
  // The subgroups first: they meet through the default group's store, which
  // rank 0 stops serving below.
  internal::destroy_subgroups();
  std::shared_ptr<ProcessGroup> group;
  std::unique_ptr<EnvStore> env_store;
  {
    std::lock_guard<std::mutex> lock(default_group_mutex());
    group.swap(default_group_slot());
    env_store.swap(env_store_slot());
    default_context_slot() = internal::DefaultGroupContext();
  }
  // Outside the lock: operations issued without wait() finish first (each
  // by its deadline), even while someone else still holds the group. It is
  // destroyed here unless the caller still holds a reference to it.
  if (group != nullptr) {
    group->wait_for_pending_work();
    internal::plan_group_destroyed(); // Note [Plan report]
  }
  group.reset();
  if (env_store != nullptr && env_store->server != nullptr && env_store->world_size > 1) {
    // See Note [Re-initialising on one port]: serve the ranks still in the
    // rendezvous until they have left it.
    std::vector<std::string> joined;
    for (int r = 1; r < env_store->world_size; ++r) {
      joined.push_back(env_round_key(env_store->round, c10::str("joined/", r)));
    }
    try {
      env_store->store->wait(joined, std::min(env_store->timeout, kMaxJoinWait));
    } catch (const std::exception& e) {
      internal::log_warning(c10::str(
          "[rank 0/", env_store->world_size, "] destroy_process_group: closing the store server "
          "although not every rank has finished its rendezvous: ", error_message(e)));
    }
  }
  // Our connections first, then (on rank 0) the server, which closes every
  // connection still open and its listener.
  env_store.reset();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(default_group_mutex());
  return default_group_slot() != nullptr;
}

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard<std::mutex> lock(default_group_mutex());
  DDP_CHECK(default_group_slot() != nullptr,
            "no default process group: call ddp::init_process_group() first (it reads RANK, "
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT as set by ddprun, or forms a world of size 1 "
            "when they are absent)");
  return default_group_slot();
}

} // namespace ddp
