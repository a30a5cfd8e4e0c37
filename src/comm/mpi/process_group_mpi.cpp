// The MPI backend: the collectives, each a task for the engine.
//
// How it works. Every collective checks its arguments on the caller's
// thread with the checks every backend shares (comm/collective_checks.h,
// given `kMpiRules`), picks the MPI datatype and operation
// (comm/mpi/mpi_types.h), and queues a body for the engine
// (comm/mpi/mpi_engine.h), which runs it on the group's worker thread. A
// body stages CUDA tensors to the host, calls one blocking MPI collective
// on the host tensors (a large allreduce runs ddp's ring over point-to-point
// messages instead, comm/mpi/mpi_ring.h), and copies the results back. MPI
// counts are ints:
// allreduce, broadcast and reduce split larger tensors into pieces; the
// other collectives refuse them with a message that says so. A tensor of no
// elements makes no MPI call (its peers' tensors have none either).

#include <ddp/comm/process_group_mpi.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

#include <ddp/comm/error.h>

#include "comm/alltoall_splits.h"
#include "comm/collective_checks.h"
#include "comm/complex_arguments.h"
#include "comm/contiguous_arguments.h"
#include "comm/fingerprint.h"
#include "comm/host_staging.h"
#include "comm/mpi/mpi_engine.h"
#include "comm/mpi/mpi_packing.h"
#include "comm/mpi/mpi_reduce_scatter.h"
#include "comm/mpi/mpi_ring.h"
#include "comm/mpi/mpi_runtime.h"
#include "comm/mpi/mpi_shared_buffers.h"
#include "comm/mpi/mpi_sparse.h"
#include "comm/mpi/mpi_types.h"
#include "comm/reduce_kernels.h"
#include "internal/check.h"
#include "internal/env.h"

namespace ddp {

namespace mpi = internal::mpi;

class ProcessGroupMPI::Impl {
 public:
  Impl(std::string who, int rank, int size, const ProcessGroupMPIOptions& options)
      : ring_allreduce_min_bytes(options.ring_allreduce_min_bytes()),
        shared_memory_min_bytes(options.shared_memory_min_bytes()),
        shared(who, "ProcessGroupMPI", rank, size),
        engine(std::move(who), size,
               mpi::EngineOptions{options.watchdog_interval(), options.arrival_wait_min_bytes()},
               options.ranks()) {}

  const int64_t ring_allreduce_min_bytes;
  const int64_t shared_memory_min_bytes;
  // The ring allreduce's scratch buffer, kept between calls; used by the
  // worker thread alone. Declared before `engine`, whose destructor stops
  // the worker, so that it outlives every task.
  std::vector<uint8_t> ring_scratch;
  // The buffers in shared memory (Note [Shared buffers]); allocated and
  // reduced by the worker thread. Declared before `engine` too.
  internal::shm::SharedBuffers shared;
  mpi::MpiEngine engine;
};

namespace {

constexpr int64_t kMaxCount = INT_MAX;

// Checks one tensor argument; `who` is "[rank R/W] op", `what` names it.
void check_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  DDP_CHECK(t.is_cpu() || t.is_cuda(), who, ": ", what, " is on device ", t.device(),
            "; the MPI backend takes CPU or CUDA tensors");
  DDP_CHECK(internal::is_supported_dtype(t.scalar_type()), who, ": ", what, " has dtype ",
            t.scalar_type(), ", which the MPI backend does not support");
  DDP_CHECK(!t.is_sparse(), who, ": ", what, " is sparse; only dense tensors are supported");
}

// The sparse COO tensor of an allreduce (see Note [Sparse allreduce over
// MPI] in mpi_sparse.cpp).
void check_sparse_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  DDP_INTERNAL_ASSERT(t.is_sparse());
  DDP_CHECK(t.is_cpu() || t.is_cuda(), who, ": ", what, " is on device ", t.device(),
            "; the MPI backend takes CPU or CUDA tensors");
  DDP_CHECK(internal::is_supported_dtype(t.scalar_type()), who, ": ", what, " has dtype ",
            t.scalar_type(), ", which the MPI backend does not support");
}

// MPI's rules for the checks of collective_checks.h: CPU or CUDA tensors,
// which may differ in device within an operation (CUDA ones are staged);
// sparse COO tensors in allreduce.
constexpr internal::TensorRules kMpiRules{&check_tensor, nullptr, &check_sparse_tensor};

void check_reducible(at::ScalarType dtype, ReduceOp op, const std::string& who) {
  DDP_CHECK(internal::reduce_kernel(dtype, op) != nullptr, who, ": ", to_string(op),
            " is not defined for dtype ", dtype,
            op == ReduceOp::kAvg ? "; AVG needs a floating-point tensor (use SUM and divide)"
                                 : "; bitwise operations need an integer or bool tensor");
}

// `numel` elements fit in one MPI count.
int checked_count(int64_t numel, const std::string& who, const char* what) {
  DDP_CHECK(numel <= kMaxCount, who, ": ", what, " has ", numel,
            " elements, more than one MPI call can take (", kMaxCount,
            "); the MPI backend splits only allreduce, broadcast and reduce. Split the tensor.");
  return static_cast<int>(numel);
}

// Calls `call(data, count)` on consecutive pieces of `tensor` that each fit
// in an MPI count.
template <typename Call>
void in_pieces(const at::Tensor& tensor, Call&& call) {
  auto* data = static_cast<char*>(tensor.data_ptr());
  const int64_t numel = tensor.numel();
  const auto element_size = static_cast<int64_t>(tensor.element_size());
  for (int64_t offset = 0; offset < numel; offset += kMaxCount) {
    call(data + offset * element_size, static_cast<int>(std::min(kMaxCount, numel - offset)));
  }
}

// The world that MPI sees is the one the launcher started: a launcher that
// is not MPI's (ddprun, torchrun: WORLD_SIZE) leaves every process a world
// of its own, and an mpirun of another MPI than the one linked in
// (OMPI_COMM_WORLD_SIZE) does the same.
void check_launcher_agrees(const mpi::MpiWorld& world) {
  const std::string who = c10::str("[rank ", world.rank, "/", world.size, "] ProcessGroupMPI");
  const auto parse = [](const std::optional<std::string>& text) -> int {
    if (!text || text->empty()) {
      return -1;
    }
    char* end = nullptr;
    const long value = std::strtol(text->c_str(), &end, 10);
    return *end == '\0' && value > 0 && value <= INT_MAX ? static_cast<int>(value) : -1;
  };
  const int launched = parse(internal::env_get(internal::kEnvWorldSize));
  DDP_CHECK(launched < 0 || launched == world.size || world.size > 1, who,
            ": the launcher started ", launched, " processes (WORLD_SIZE=", launched,
            ", as ddprun and torchrun set it), but MPI sees this process as a world of its own. "
            "MPI's ranks must be started by an MPI launcher, which connects them: run `DDP_BACKEND=mpi "
            "mpirun -np ", launched, " ./app` (as root, add --allow-run-as-root) or `srun --mpi=pmix -n ",
            launched, " ./app`, or use the Gloo backend (leave DDP_BACKEND unset) under ddprun or torchrun.");
  DDP_CHECK(launched < 0 || launched == world.size, who, ": WORLD_SIZE=", launched,
            " but MPI_COMM_WORLD has ", world.size,
            " ranks; under mpirun or srun the world is MPI's: unset WORLD_SIZE and RANK");
  const int ompi = parse(internal::env_get(internal::kEnvOmpiSize));
  DDP_CHECK(ompi < 0 || ompi == world.size, who, ": Open MPI's mpirun started ", ompi,
            " processes (OMPI_COMM_WORLD_SIZE=", ompi, "), but this program's MPI library sees ",
            world.size, ": the program is linked with another MPI than the mpirun that started it (",
            ProcessGroupMPI::mpi_version(), "); start it with that MPI's own mpirun");
}

} // namespace

// ---- Construction ------------------------------------------------------------

std::shared_ptr<ProcessGroupMPI> ProcessGroupMPI::create(const ProcessGroupMPIOptions& options) {
  DDP_CHECK(options.watchdog_interval().count() > 0,
            "ProcessGroupMPI: watchdog_interval must be positive (got ",
            options.watchdog_interval().count(), " ms)");
  const mpi::MpiWorld world = mpi::ensure_mpi_initialized("ProcessGroupMPI");
  check_launcher_agrees(world);
  const auto& ranks = options.ranks();
  if (ranks.empty()) {
    return std::make_shared<ProcessGroupMPI>(PrivateTag{}, world.rank, world.size, options);
  }
  const std::string who = c10::str("[rank ", world.rank, "/", world.size, "] ProcessGroupMPI");
  int rank = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    DDP_CHECK(ranks[i] >= 0 && ranks[i] < world.size, who, ": ranks[", i, "] = ", ranks[i],
              " is outside MPI_COMM_WORLD's ranks [0, ", world.size, ")");
    DDP_CHECK(i == 0 || ranks[i - 1] < ranks[i], who,
              ": ranks must be sorted ascending without repeats (got ", ranks[i - 1], " then ",
              ranks[i], ")");
    if (ranks[i] == world.rank) {
      rank = static_cast<int>(i);
    }
  }
  DDP_CHECK(rank >= 0, who, ": this rank is not one of the group's ", ranks.size(),
            " ranks; only members create the group (ddp::new_group gives the others a handle)");
  return std::make_shared<ProcessGroupMPI>(PrivateTag{}, rank, static_cast<int>(ranks.size()),
                                           options);
}

std::string ProcessGroupMPI::mpi_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  const auto end = version.find_first_of("\n,");
  return end == std::string::npos ? version : version.substr(0, end);
}

ProcessGroupMPI::ProcessGroupMPI(PrivateTag, int rank, int size, const ProcessGroupMPIOptions& options)
    : ProcessGroup(rank, size, options.timeout()) {
  impl_ = std::make_unique<Impl>(rank_prefix(), rank, size, options);
  set_supports_sparse_allreduce(true); // Note [Sparse allreduce over MPI]
}

ProcessGroupMPI::~ProcessGroupMPI() = default;

// ---- Collectives -----------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupMPI::allreduce(const at::Tensor& tensor,
                                                 const AllreduceOptions& options) {
  return allreduce_coalesced({tensor}, options);
}

std::shared_ptr<Work> ProcessGroupMPI::allreduce_coalesced(const std::vector<at::Tensor>& tensors,
                                                           const AllreduceOptions& options) {
  const std::string who = rank_prefix() + " allreduce";
  if (internal::has_complex(tensors)) { // Note [Complex arguments]
    internal::check_complex_reduction(tensors, options.op, who);
    internal::ComplexArguments complex;
    return complex.given_back(allreduce_coalesced(complex.real(tensors), options));
  }
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    internal::check_sparse_allreduce(tensors[0], options.op, who, kMpiRules);
    const at::Tensor tensor = tensors[0];
    // The dense sizes must agree; the number of entries may differ, and the
    // collective compares the sizes itself.
    return impl_->engine.enqueue(
        internal::Fingerprint{"allreduce", tensor.scalar_type(), internal::Fingerprint::kSparse,
                              options.op},
        resolve_timeout(options.timeout), tensors, 0, [tensor, who](MPI_Comm comm) {
          mpi::sparse_allreduce(tensor, comm, who);
          return std::vector<at::Tensor>{tensor};
        });
  }
  internal::check_coalesced(tensors, who, kMpiRules);
  check_reducible(tensors[0].scalar_type(), options.op, who);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const std::vector<at::Tensor> dense = tensors.size() == 1
      ? std::vector<at::Tensor>{args.output(tensors[0], who, "tensor")}
      : args.outputs(tensors, who, "tensors");
  const auto reduction = mpi::reduction_of(tensors[0].scalar_type(), options.op);
  const bool average = options.op == ReduceOp::kAvg;
  const int size = this->size();
  const int rank = this->rank();
  const int64_t bytes = mpi::bytes_of(tensors);
  // The same choices on every rank: they depend on the size alone (the
  // fingerprint check has compared dtype and element count).
  const bool ring = size > 1 && impl_->ring_allreduce_min_bytes >= 0 &&
                    bytes >= impl_->ring_allreduce_min_bytes;
  const bool try_shared = size > 1 && impl_->shared_memory_min_bytes >= 0 &&
                          bytes >= impl_->shared_memory_min_bytes;
  auto kernel = ring || try_shared ? internal::reduce_kernel(tensors[0].scalar_type(), options.op)
                                   : internal::ReduceKernel();
  // Both outlive the task (see Impl).
  std::vector<uint8_t>* scratch = &impl_->ring_scratch;
  internal::shm::SharedBuffers* shared = &impl_->shared;
  return impl_->engine.enqueue(
      internal::Fingerprint{"allreduce", tensors[0].scalar_type(), mpi::total_numel(tensors), options.op},
      resolve_timeout(options.timeout), args.keep(dense), bytes,
      args.wrap([tensors = dense, reduction, average, size, rank, ring, try_shared, bytes, kernel,
                 scratch, shared](MPI_Comm comm) {
        // Note [Shared buffers]: every rank asks whether they all pass
        // the same range of one shared buffer once the group has any.
        if (try_shared && shared->any_allocated()) {
          const auto where =
              tensors.size() == 1 ? shared->locate(tensors[0]) : internal::shm::SharedLocation{};
          mpi::MpiCoordinator coordinator(comm);
          if (shared->agree(coordinator, where, bytes)) {
            shared->allreduce(coordinator, tensors[0], where, kernel, average,
                              internal::shm::ReduceOrder::kOwnFirst);
            return tensors;
          }
        }
        internal::HostStaging staging;
        // One tensor is reduced in place; several are packed into one buffer
        // so that they cost one collective.
        const at::Tensor flat =
            tensors.size() == 1 ? staging.in(tensors[0]) : mpi::packed_on_host(tensors);
        in_pieces(flat, [&](void* data, int count) {
          if (ring) {
            mpi::ring_allreduce(data, count, flat.element_size(), reduction.datatype, kernel, comm,
                                rank, size, *scratch);
          } else {
            mpi::check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, count, reduction.datatype,
                                         reduction.op, comm),
                           "MPI_Allreduce");
          }
        });
        if (average && flat.numel() > 0) {
          flat.div_(size);
        }
        if (tensors.size() == 1) {
          staging.copy_back();
        } else {
          mpi::unpack(flat, tensors);
        }
        return tensors;
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::broadcast(const at::Tensor& tensor,
                                                 const BroadcastOptions& options) {
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(broadcast(complex.real(tensor), options));
  }
  const std::string who = rank_prefix() + " broadcast";
  internal::check_rooted(tensor, options.root_rank, size(), who, kMpiRules);
  const int root = options.root_rank;
  const MPI_Datatype datatype = mpi::datatype_of(tensor.scalar_type());
  internal::ContiguousArguments args;
  const at::Tensor dense = args.output(tensor, who, "tensor");
  return impl_->engine.enqueue(
      internal::Fingerprint{"broadcast", tensor.scalar_type(), tensor.numel(), std::nullopt, root},
      resolve_timeout(options.timeout), args.keep({dense}), static_cast<int64_t>(tensor.nbytes()),
      args.wrap([tensor = dense, root, datatype](MPI_Comm comm) {
        internal::HostStaging staging;
        const auto host = staging.in(tensor);
        in_pieces(host, [&](void* data, int count) {
          mpi::check_mpi(MPI_Bcast(data, count, datatype, root, comm), "MPI_Bcast");
        });
        staging.copy_back();
        return std::vector<at::Tensor>{tensor};
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::reduce(const at::Tensor& tensor, const ReduceOptions& options) {
  const std::string who = rank_prefix() + " reduce";
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    internal::check_complex_reduction(tensor, options.op, who);
    internal::ComplexArguments complex;
    return complex.given_back(reduce(complex.real(tensor), options));
  }
  internal::check_rooted(tensor, options.root_rank, size(), who, kMpiRules);
  check_reducible(tensor.scalar_type(), options.op, who);
  const auto reduction = mpi::reduction_of(tensor.scalar_type(), options.op);
  const int root = options.root_rank;
  const bool is_root = rank() == root;
  const bool average = options.op == ReduceOp::kAvg;
  const int size = this->size();
  internal::ContiguousArguments args;
  const at::Tensor dense = args.output(tensor, who, "tensor");
  return impl_->engine.enqueue(
      internal::Fingerprint{"reduce", tensor.scalar_type(), tensor.numel(), options.op, root},
      resolve_timeout(options.timeout), args.keep({dense}), static_cast<int64_t>(tensor.nbytes()),
      args.wrap([tensor = dense, reduction, root, is_root, average, size](MPI_Comm comm) {
        internal::HostStaging staging;
        const auto host = staging.in(tensor);
        in_pieces(host, [&](void* data, int count) {
          // The root reduces into its own buffer; the others only send.
          mpi::check_mpi(MPI_Reduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr, count,
                                    reduction.datatype, reduction.op, root, comm),
                         "MPI_Reduce");
        });
        if (average && is_root && host.numel() > 0) {
          host.div_(size);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{tensor};
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::allgather(const std::vector<at::Tensor>& outputs,
                                                 const at::Tensor& input,
                                                 const AllgatherOptions& options) {
  if (internal::has_complex(input) || internal::has_complex(outputs)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(allgather(complex.real(outputs), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " allgather";
  internal::check_allgather(outputs, input, size(), who, kMpiRules);
  const int count = checked_count(input.numel(), who, "input");
  const MPI_Datatype datatype = mpi::datatype_of(input.scalar_type());
  internal::ContiguousArguments args;
  std::vector<at::Tensor> tensors = args.outputs(outputs, who, "outputs");
  tensors.push_back(args.input(input));
  return impl_->engine.enqueue(
      internal::Fingerprint{"allgather", input.scalar_type(), input.numel()},
      resolve_timeout(options.timeout), args.keep(tensors), static_cast<int64_t>(input.nbytes()),
      args.wrap([outputs = std::vector<at::Tensor>(tensors.begin(), tensors.end() - 1),
                 input = tensors.back(), count, datatype](MPI_Comm comm) {
        const auto host_input = input.cpu();
        auto flat = at::empty({static_cast<int64_t>(outputs.size()) * input.numel()}, host_input.options());
        if (count > 0) {
          mpi::check_mpi(MPI_Allgather(host_input.data_ptr(), count, datatype, flat.data_ptr(), count,
                                       datatype, comm),
                         "MPI_Allgather");
        }
        mpi::unpack(flat, outputs);
        return outputs;
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::allgather_into_tensor(const at::Tensor& output,
                                                             const at::Tensor& input,
                                                             const AllgatherOptions& options) {
  if (internal::has_complex(input) || internal::has_complex(output)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(allgather_into_tensor(complex.real(output), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " allgather_into_tensor";
  internal::check_allgather_into_tensor(output, input, size(), who, kMpiRules);
  const int count = checked_count(input.numel(), who, "input");
  const MPI_Datatype datatype = mpi::datatype_of(input.scalar_type());
  internal::ContiguousArguments args;
  const at::Tensor dense_output = args.output(output, who, "output");
  const at::Tensor dense_input = args.input(input);
  const int64_t bytes = static_cast<int64_t>(input.nbytes());
  // The same choice on every rank: it depends on the size alone.
  const bool try_shared = size() > 1 && impl_->shared_memory_min_bytes >= 0 &&
                          bytes >= impl_->shared_memory_min_bytes;
  internal::shm::SharedBuffers* shared = &impl_->shared; // outlives the task (see Impl)
  return impl_->engine.enqueue(
      internal::Fingerprint{"allgather_into_tensor", input.scalar_type(), input.numel()},
      resolve_timeout(options.timeout), args.keep({dense_output, dense_input}), bytes,
      args.wrap([output = dense_output, input = dense_input, count, datatype, try_shared, bytes,
                 shared](MPI_Comm comm) {
        // Note [Shared buffers]: the inputs may all be in shared memory.
        if (try_shared && shared->any_allocated()) {
          const auto where = shared->locate_gather_input(input, output);
          mpi::MpiCoordinator coordinator(comm);
          if (shared->agree(coordinator, where, bytes)) {
            shared->allgather(coordinator, output, where, bytes);
            return std::vector<at::Tensor>{output};
          }
        }
        internal::HostStaging staging;
        const auto host_output = staging.in(output);
        const auto host_input = mpi::separate_input(input.cpu(), host_output);
        if (count > 0) {
          mpi::check_mpi(MPI_Allgather(host_input.data_ptr(), count, datatype, host_output.data_ptr(),
                                       count, datatype, comm),
                         "MPI_Allgather");
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::gather(const std::vector<at::Tensor>& outputs,
                                              const at::Tensor& input, const GatherOptions& options) {
  if (internal::has_complex(input) || internal::has_complex(outputs)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(gather(complex.real(outputs), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " gather";
  internal::check_gather(outputs, input, rank(), options.root_rank, size(), who, kMpiRules);
  const int count = checked_count(input.numel(), who, "input");
  const MPI_Datatype datatype = mpi::datatype_of(input.scalar_type());
  const int root = options.root_rank;
  const bool is_root = rank() == root;
  const int size = this->size();
  internal::ContiguousArguments args;
  std::vector<at::Tensor> tensors = args.outputs(outputs, who, "outputs");
  tensors.push_back(args.input(input));
  return impl_->engine.enqueue(
      internal::Fingerprint{"gather", input.scalar_type(), input.numel(), std::nullopt, root},
      resolve_timeout(options.timeout), args.keep(tensors), static_cast<int64_t>(input.nbytes()),
      args.wrap([outputs = std::vector<at::Tensor>(tensors.begin(), tensors.end() - 1),
                 input = tensors.back(), count, datatype, root, is_root, size](MPI_Comm comm) {
        const auto host_input = input.cpu();
        at::Tensor flat;
        if (is_root) {
          flat = at::empty({size * input.numel()}, host_input.options());
        }
        if (count > 0) {
          mpi::check_mpi(MPI_Gather(host_input.data_ptr(), count, datatype,
                                    is_root ? flat.data_ptr() : nullptr, count, datatype, root, comm),
                         "MPI_Gather");
        }
        if (is_root) {
          mpi::unpack(flat, outputs);
        }
        return outputs;
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::scatter(const at::Tensor& output,
                                               const std::vector<at::Tensor>& inputs,
                                               const ScatterOptions& options) {
  if (internal::has_complex(output) || internal::has_complex(inputs)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(scatter(complex.real(output), complex.real(inputs), options));
  }
  const std::string who = rank_prefix() + " scatter";
  internal::check_scatter(output, inputs, rank(), options.root_rank, size(), who, kMpiRules);
  const int count = checked_count(output.numel(), who, "output");
  const MPI_Datatype datatype = mpi::datatype_of(output.scalar_type());
  const int root = options.root_rank;
  const bool is_root = rank() == root;
  internal::ContiguousArguments args;
  std::vector<at::Tensor> tensors = args.inputs(inputs);
  tensors.push_back(args.output(output, who, "output"));
  return impl_->engine.enqueue(
      internal::Fingerprint{"scatter", output.scalar_type(), output.numel(), std::nullopt, root},
      resolve_timeout(options.timeout), args.keep(tensors), static_cast<int64_t>(output.nbytes()),
      args.wrap([output = tensors.back(), inputs = std::vector<at::Tensor>(tensors.begin(), tensors.end() - 1),
                 count, datatype, root, is_root](MPI_Comm comm) {
        internal::HostStaging staging;
        const auto host_output = staging.in(output);
        // Packed into a new buffer, so that it never overlaps the output.
        const at::Tensor flat = is_root ? mpi::packed_on_host(inputs) : at::Tensor();
        if (count > 0) {
          mpi::check_mpi(MPI_Scatter(is_root ? flat.data_ptr() : nullptr, count, datatype,
                                     host_output.data_ptr(), count, datatype, root, comm),
                         "MPI_Scatter");
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::reduce_scatter(const at::Tensor& output,
                                                      const std::vector<at::Tensor>& inputs,
                                                      const ReduceScatterOptions& options) {
  const std::string who = rank_prefix() + " reduce_scatter";
  if (internal::has_complex(output) || internal::has_complex(inputs)) { // Note [Complex arguments]
    internal::check_complex_reduction(inputs, options.op, who);
    internal::ComplexArguments complex;
    return complex.given_back(reduce_scatter(complex.real(output), complex.real(inputs), options));
  }
  internal::check_reduce_scatter(output, inputs, rank(), size(), who, kMpiRules);
  check_reducible(output.scalar_type(), options.op, who);
  const auto reduction = mpi::reduction_of(output.scalar_type(), options.op);
  const bool average = options.op == ReduceOp::kAvg;
  const int size = this->size();
  // Chunks may differ in size (inputs[r] is rank r's), then
  // MPI_Reduce_scatter takes every rank's count.
  std::vector<int> counts;
  int64_t total = 0;
  for (size_t r = 0; r < inputs.size(); ++r) {
    counts.push_back(checked_count(inputs[r].numel(), who, c10::str("inputs[", r, "]").c_str()));
    total += inputs[r].numel();
  }
  checked_count(total, who, "the inputs together");
  const bool even = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
  // See mpi_reduce_scatter.h: ours where ddp has a kernel for the pair.
  auto kernel = internal::reduce_kernel(output.scalar_type(), options.op);
  const MPI_Datatype datatype = mpi::datatype_of(output.scalar_type());
  const int rank = this->rank();
  const int64_t bytes = mpi::bytes_of(inputs);
  // The same choice on every rank: the size alone (and the dtype and op,
  // which the fingerprint check compares).
  const bool try_shared = size > 1 && kernel && impl_->shared_memory_min_bytes >= 0 &&
                          bytes >= impl_->shared_memory_min_bytes;
  internal::shm::SharedBuffers* shared = &impl_->shared; // outlives the task (see Impl)
  internal::ContiguousArguments args;
  std::vector<at::Tensor> tensors = args.inputs(inputs);
  tensors.push_back(args.output(output, who, "output"));
  return impl_->engine.enqueue(
      internal::Fingerprint{"reduce_scatter", output.scalar_type(), total, options.op},
      resolve_timeout(options.timeout), args.keep(tensors), bytes,
      args.wrap([output = tensors.back(), inputs = std::vector<at::Tensor>(tensors.begin(), tensors.end() - 1),
                 counts, total, even, reduction, average, size, kernel, datatype, rank, try_shared, shared,
                 bytes](MPI_Comm comm) {
        // Note [Shared buffers]: the inputs may lie in shared memory.
        if (try_shared && shared->any_allocated() && !shared->multi_host()) {
          const auto where = shared->locate_scatter_inputs(inputs, output);
          mpi::MpiCoordinator coordinator(comm);
          if (shared->agree(coordinator, where, bytes)) {
            shared->reduce_scatter(coordinator, output, where, kernel, average);
            return std::vector<at::Tensor>{output};
          }
        }
        internal::HostStaging staging;
        const auto host_output = staging.in(output);
        // A new buffer unless the inputs lie end to end apart from the output.
        const auto flat = mpi::inputs_on_host(inputs, host_output);
        if (total > 0) {
          if (kernel) {
            mpi::direct_reduce_scatter(flat.data_ptr(), counts, host_output.data_ptr(), flat.element_size(),
                                       datatype, kernel, comm, rank, size);
          } else if (even) {
            mpi::check_mpi(MPI_Reduce_scatter_block(flat.data_ptr(), host_output.data_ptr(),
                                                    counts[0], reduction.datatype, reduction.op,
                                                    comm),
                           "MPI_Reduce_scatter_block");
          } else {
            mpi::check_mpi(MPI_Reduce_scatter(flat.data_ptr(), host_output.data_ptr(),
                                              counts.data(), reduction.datatype, reduction.op, comm),
                           "MPI_Reduce_scatter");
          }
          if (average && host_output.numel() > 0) {
            host_output.div_(size);
          }
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::alltoall(const at::Tensor& output, const at::Tensor& input,
                                                const AlltoallOptions& options) {
  if (internal::has_complex(output) || internal::has_complex(input)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(alltoall(complex.real(output), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " alltoall";
  const auto layout = internal::check_alltoall(output, input, size(), options, who, kMpiRules);
  if (layout.uneven) {
    checked_count(input.numel(), who, "input");
    checked_count(output.numel(), who, "output");
    const MPI_Datatype datatype = mpi::datatype_of(input.scalar_type());
    internal::ContiguousArguments args;
    const at::Tensor dense_output = args.output(output, who, "output");
    const at::Tensor dense_input = args.input(input);
    const int size = this->size();
    // Counts and displacements in elements (each fits an int: the totals do).
    const auto ints = [](const std::vector<int64_t>& values) { return std::vector<int>(values.begin(), values.end()); };
    return impl_->engine.enqueue(
        internal::Fingerprint{"alltoall", input.scalar_type(), internal::Fingerprint::kUneven},
        resolve_timeout(options.timeout), args.keep({dense_output, dense_input}),
        static_cast<int64_t>(input.nbytes()),
        args.wrap([output = dense_output, input = dense_input, layout, datatype, size, who,
                   send_counts = ints(layout.send_counts), send_offsets = ints(layout.send_offsets),
                   recv_counts = ints(layout.recv_counts),
                   recv_offsets = ints(layout.recv_offsets)](MPI_Comm comm) {
          // Note [Uneven all-to-all]: every rank's splits, checked alike.
          const auto mine = layout.agreement_entry();
          std::vector<int64_t> table(mine.size() * static_cast<size_t>(size));
          mpi::check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, table.data(),
                                       static_cast<int>(mine.size()), MPI_INT64_T, comm),
                         "MPI_Allgather (alltoall split sizes)");
          internal::check_alltoall_agreement(table.data(), size, who);
          internal::HostStaging staging;
          const auto host_output = staging.write(output);
          const auto host_input = mpi::separate_input(input.cpu(), host_output);
          mpi::check_mpi(MPI_Alltoallv(host_input.data_ptr(), send_counts.data(), send_offsets.data(), datatype,
                                       host_output.data_ptr(), recv_counts.data(), recv_offsets.data(), datatype,
                                       comm),
                         "MPI_Alltoallv");
          staging.copy_back();
          return std::vector<at::Tensor>{output};
        }));
  }
  checked_count(input.numel(), who, "input");
  const int count = static_cast<int>(input.numel() / size()); // per rank
  const MPI_Datatype datatype = mpi::datatype_of(input.scalar_type());
  internal::ContiguousArguments args;
  const at::Tensor dense_output = args.output(output, who, "output");
  const at::Tensor dense_input = args.input(input);
  return impl_->engine.enqueue(
      internal::Fingerprint{"alltoall", input.scalar_type(), input.numel()},
      resolve_timeout(options.timeout), args.keep({dense_output, dense_input}),
      static_cast<int64_t>(input.nbytes()),
      args.wrap([output = dense_output, input = dense_input, count, datatype](MPI_Comm comm) {
        internal::HostStaging staging;
        const auto host_output = staging.in(output);
        const auto host_input = mpi::separate_input(input.cpu(), host_output);
        if (count > 0) {
          mpi::check_mpi(MPI_Alltoall(host_input.data_ptr(), count, datatype, host_output.data_ptr(),
                                      count, datatype, comm),
                         "MPI_Alltoall");
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupMPI::barrier(const BarrierOptions& options) {
  return impl_->engine.enqueue(internal::Fingerprint("barrier"), resolve_timeout(options.timeout), {}, 0,
                               [](MPI_Comm comm) {
                                 mpi::check_mpi(MPI_Barrier(comm), "MPI_Barrier");
                                 return std::vector<at::Tensor>{};
                               });
}

at::Tensor ProcessGroupMPI::allocate_collective_buffer(int64_t numel,
                                                       const at::TensorOptions& options) {
  auto buffer = allocate_shared(numel, options, false);
  return buffer.defined() ? buffer : ProcessGroup::allocate_collective_buffer(numel, options);
}

at::Tensor ProcessGroupMPI::allocate_common_buffer(int64_t numel, const at::TensorOptions& options) {
  return allocate_shared(numel, options, true);
}

at::Tensor ProcessGroupMPI::allocate_shared(int64_t numel, const at::TensorOptions& options, bool common) {
  const char* what = common ? "allocate_common_buffer" : "allocate_collective_buffer";
  const std::string who = rank_prefix() + " " + what;
  DDP_CHECK(numel >= 0, who, ": numel must not be negative (got ", numel, ")");
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  // The same choice on every rank, given the same arguments.
  if (size() < 2 || options.device().type() != c10::kCPU || impl_->shared_memory_min_bytes < 0 ||
      bytes == 0 || bytes < impl_->shared_memory_min_bytes) {
    return {};
  }
  // A collective in issue order, on the worker thread: the allocation makes
  // MPI calls on the group's communicator (Note [Shared buffers]).
  auto buffer = std::make_shared<at::Tensor>();
  internal::shm::SharedBuffers* shared = &impl_->shared; // outlives the task (see Impl)
  auto work = impl_->engine.enqueue(
      internal::Fingerprint{what, options.dtype().toScalarType(), numel},
      timeout(), {}, 0, [buffer, shared, numel, options, common](MPI_Comm comm) {
        mpi::MpiCoordinator coordinator(comm);
        *buffer = shared->allocate(coordinator, numel, options, true, common);
        return std::vector<at::Tensor>{};
      });
  work->wait();
  return *buffer;
}

bool ProcessGroupMPI::is_shared_buffer(const at::Tensor& tensor) const {
  return tensor.defined() && impl_->shared.locate(tensor).id >= 0;
}

void ProcessGroupMPI::wait_for_pending_work() {
  impl_->engine.wait_until_idle();
}

// ---- Point to point ----------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupMPI::send(const at::Tensor& tensor, int dst_rank,
                                            const PointToPointOptions& options) {
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    // The transfer's own Work, which completes in wait(): its result is the view.
    internal::ComplexArguments complex;
    return send(complex.real(tensor), dst_rank, options);
  }
  const std::string who = rank_prefix() + " send";
  internal::check_point_to_point(tensor, dst_rank, options.tag, rank(), size(), who, "destination",
                                 kMpiRules);
  DDP_CHECK(options.tag <= impl_->engine.max_tag(), who, ": tag ", options.tag,
            " is above the largest tag this MPI accepts, ", impl_->engine.max_tag(), " (MPI_TAG_UB)");
  checked_count(tensor.numel(), who, "tensor");
  return impl_->engine.post_point_to_point(
      true, tensor, dst_rank, options.tag, resolve_timeout(options.timeout),
      c10::str(who, " to rank ", dst_rank, " tag ", options.tag));
}

std::shared_ptr<Work> ProcessGroupMPI::recv(const at::Tensor& tensor, int src_rank,
                                            const PointToPointOptions& options) {
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    // The transfer's own Work, which completes in wait(): its result is the view.
    internal::ComplexArguments complex;
    return recv(complex.real(tensor), src_rank, options);
  }
  const std::string who = rank_prefix() + " recv";
  internal::check_point_to_point(tensor, src_rank, options.tag, rank(), size(), who, "source",
                                 kMpiRules);
  DDP_CHECK(options.tag <= impl_->engine.max_tag(), who, ": tag ", options.tag,
            " is above the largest tag this MPI accepts, ", impl_->engine.max_tag(), " (MPI_TAG_UB)");
  checked_count(tensor.numel(), who, "tensor");
  return impl_->engine.post_point_to_point(
      false, tensor, src_rank, options.tag, resolve_timeout(options.timeout),
      c10::str(who, " from rank ", src_rank, " tag ", options.tag));
}

} // namespace ddp
