// init_process_group(): reading the launcher's environment, creating the
// store and the backend, and keeping the default group.

#include <ddp/init.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <ddp/store/hash_store.h>
#include <ddp/comm/process_group_composite.h>
#include <ddp/comm/process_group_gloo.h>
#include <ddp/store/tcp_store.h>
#ifdef DDP_WITH_NCCL
#include <ddp/comm/process_group_nccl.h>
#endif

#include "internal/check.h"
#include "internal/env.h"

namespace ddp {

std::string to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
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

void read_master(EnvReport& report, WorldInfo& info) {
  auto addr = report.read(internal::kEnvMasterAddr);
  auto port = report.read_int(internal::kEnvMasterPort, 1, 65535, false);
  if (info.world_size > 1) {
    if (!addr || addr->empty()) {
      report.problem("MASTER_ADDR is not set (needed when WORLD_SIZE > 1)");
    }
    if (!port && !internal::env_get(internal::kEnvMasterPort)) {
      report.problem("MASTER_PORT is not set (needed when WORLD_SIZE > 1)");
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
                     const internal::EnvVar& local_size_var) {
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
  // Without the local variables, assume one node.
  info.local_rank = local_rank.value_or(info.rank);
  info.local_world_size = local_size.value_or(info.world_size);
  if (local_rank && local_size && *local_rank >= *local_size) {
    report.problem(c10::str(local_rank_var.name, "=", *local_rank, " is not below ",
                            local_size_var.name, "=", *local_size));
  }
  read_master(report, info);
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

std::shared_ptr<ProcessGroup> create_group(std::shared_ptr<Store> store, int rank, int world_size,
                                           const InitOptions& options, const std::string& master_addr) {
  DDP_CHECK(store != nullptr, "init_process_group: the store is null");
  Backend backend = options.backend();
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

} // namespace

WorldInfo world_info_from_env() {
  using namespace internal;
  if (any_set({&kEnvRank, &kEnvWorldSize})) {
    return read_world("torchrun/ddprun (RANK, WORLD_SIZE)", kEnvRank, kEnvWorldSize, kEnvLocalRank,
                      kEnvLocalWorldSize);
  }
  if (any_set({&kEnvSlurmProcId, &kEnvSlurmNTasks})) {
    auto info = read_world("Slurm", kEnvSlurmProcId, kEnvSlurmNTasks, kEnvSlurmLocalId,
                           kEnvSlurmNTasksPerNode);
    info.source = "slurm";
    return info;
  }
  if (any_set({&kEnvOmpiRank, &kEnvOmpiSize})) {
    auto info = read_world("Open MPI", kEnvOmpiRank, kEnvOmpiSize, kEnvOmpiLocalRank,
                           kEnvOmpiLocalSize);
    info.source = "openmpi";
    return info;
  }
  WorldInfo info;
  info.source = "none";
  return info;
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  const WorldInfo info = world_info_from_env();
  std::shared_ptr<Store> store;
  if (info.world_size == 1 && info.master_addr.empty()) {
    // Alone: no launcher, or a launcher with one rank and no master. Nothing
    // to meet, so no network.
    store = std::make_shared<HashStore>();
  } else {
    store = std::make_shared<TCPStore>(
        info.master_addr, TCPStoreOptions()
                              .port(static_cast<uint16_t>(info.master_port))
                              .is_server(info.rank == 0)
                              .timeout(options.timeout()));
  }
  std::lock_guard<std::mutex> lock(default_group_mutex());
  DDP_CHECK(default_group_slot() == nullptr,
            "init_process_group: the default process group already exists; call "
            "ddp::destroy_process_group() before creating another");
  default_group_slot() =
      create_group(std::move(store), info.rank, info.world_size, options, info.master_addr);
  return default_group_slot();
}

std::shared_ptr<ProcessGroup> init_process_group(std::shared_ptr<Store> store, int rank,
                                                 int world_size, const InitOptions& options) {
  std::lock_guard<std::mutex> lock(default_group_mutex());
  DDP_CHECK(default_group_slot() == nullptr,
            "init_process_group: the default process group already exists; call "
            "ddp::destroy_process_group() before creating another");
  default_group_slot() = create_group(std::move(store), rank, world_size, options, "");
  return default_group_slot();
}

std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank,
                                                int world_size, const InitOptions& options) {
  return create_group(std::move(store), rank, world_size, options, "");
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(default_group_mutex());
    group.swap(default_group_slot());
  }
  // The group is destroyed here, outside the lock, unless the caller still
  // holds a reference to it.
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
