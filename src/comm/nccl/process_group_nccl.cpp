// The NCCL backend: argument checks and the collectives, each expressed as
// the NCCL calls of one `NcclOp`. The engine (nccl_engine.h) runs them:
// communicator, stream ordering, Works and the watchdog.
//
// Every collective checks its arguments on the caller's thread and throws
// c10::Error on misuse, before it takes a sequence number, so that a
// rejected call does not shift the numbering against the other ranks. Each
// also describes its call as a Fingerprint, built exactly as the Gloo and
// MPI backends build it for the same collective (so that mismatch messages
// read the same on every backend); the engine checks it with more than one
// rank (Note [NCCL fingerprint check]).
// Reshaping that must come before the NCCL call (packing reduce_scatter's
// inputs) runs on the caller's current stream, which the operation waits
// for; unpacking after it (allgather's outputs) runs on the communicator's
// stream in `NcclOp::finish`.

#include <ddp/comm/process_group_nccl.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>

#include <ddp/comm/error.h>

#include "comm/alltoall_splits.h"
#include "comm/collective_checks.h"
#include "comm/contiguous_arguments.h"
#include "comm/nccl/nccl_engine.h"
#include "comm/nccl/nccl_support.h"
#include "internal/check.h"

namespace ddp {

// The engine does the work; see nccl_engine.h. Thread-safety: the engine's.
class ProcessGroupNCCL::Impl {
 public:
  Impl(std::shared_ptr<Store> store, int rank, int size, internal::NcclEngineOptions options,
       std::string who)
      : engine(std::move(store), rank, size, std::move(options), std::move(who)) {}

  internal::NcclEngine engine;
};

// ---- Construction ------------------------------------------------------------------

std::shared_ptr<ProcessGroupNCCL> ProcessGroupNCCL::create(
    std::shared_ptr<Store> store, int rank, int size, const ProcessGroupNCCLOptions& options) {
  return std::make_shared<ProcessGroupNCCL>(PrivateTag{}, std::move(store), rank, size, options);
}

bool ProcessGroupNCCL::is_available() {
  return c10::cuda::device_count() > 0;
}

std::string ProcessGroupNCCL::nccl_version() {
  int code = 0;
  internal::check_nccl(ncclGetVersion(&code), nullptr, "ncclGetVersion");
  // NCCL_VERSION's encoding: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code / 100) % 100 : (code / 100) % 10;
  return c10::str(major, ".", minor, ".", code % 100);
}

ProcessGroupNCCL::ProcessGroupNCCL(PrivateTag, std::shared_ptr<Store> store, int rank, int size,
                                   const ProcessGroupNCCLOptions& options)
    : ProcessGroup(rank, size, options.timeout()) {
  const std::string who = rank_prefix() + " ProcessGroupNCCL";
  DDP_CHECK(store != nullptr, who, ": the store is null");
  DDP_CHECK(options.watchdog_interval().count() > 0, who,
            ": watchdog_interval must be positive (got ", options.watchdog_interval().count(),
            " ms)");
  const int devices = static_cast<int>(c10::cuda::device_count());
  DDP_CHECK(devices > 0, who,
            ": no CUDA device is visible to this process; the NCCL backend needs one GPU per "
            "process (use Backend::kGloo for CPU tensors)");
  DDP_CHECK(options.device_index() >= -1 && options.device_index() < devices, who,
            ": device_index ", options.device_index(), " is out of range; this process sees ",
            devices, " CUDA device(s) (use -1 to take the device of the first tensors)");
  int version = 0;
  internal::check_nccl(ncclGetVersion(&version), nullptr, who + ": ncclGetVersion");
  DDP_CHECK(version >= NCCL_VERSION(2, 14, 0), who, ": the NCCL library loaded at run time is ",
            nccl_version(), ", older than 2.14, which the backend needs (non-blocking communicators)");

  internal::NcclEngineOptions engine_options;
  engine_options.timeout = options.timeout();
  engine_options.group_name = options.group_name();
  engine_options.device_index = options.device_index();
  engine_options.high_priority_stream = options.high_priority_stream();
  engine_options.watchdog_interval = options.watchdog_interval();
  impl_ = std::make_unique<Impl>(std::move(store), rank, size, std::move(engine_options),
                                 rank_prefix());
}

ProcessGroupNCCL::~ProcessGroupNCCL() = default;

void ProcessGroupNCCL::wait_for_pending_work() {
  impl_->engine.wait_for_pending();
}

int ProcessGroupNCCL::device_index() const {
  return impl_->engine.device();
}

// ---- Argument checks -----------------------------------------------------------------

namespace {

// Checks one tensor argument; `who` is "[rank R/W] op", `what` names the
// argument ("tensor", "outputs[2]").
void check_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  DDP_CHECK(t.is_cuda(), who, ": ", what, " is on device ", t.device(),
            "; the NCCL backend takes CUDA tensors on this process's GPU (use a Gloo group for "
            "CPU tensors)");
  DDP_CHECK(!t.is_sparse(), who, ": ", what, " is sparse; only dense tensors are supported");
}

// NCCL's rules for the checks of collective_checks.h.
constexpr internal::TensorRules kNcclRules{&check_tensor, "the NCCL backend drives one GPU per process"};

int device_index_of(const at::Tensor& t) {
  return static_cast<int>(t.device().index());
}

// The address of chunk `index` of `chunk_bytes` bytes in `tensor`.
void* chunk(const at::Tensor& tensor, int64_t index, size_t chunk_bytes) {
  return static_cast<uint8_t*>(tensor.data_ptr()) + static_cast<size_t>(index) * chunk_bytes;
}

// Divides each tensor by the world size: AVG where NCCL lacks ncclAvg.
std::function<void()> divide_by(std::vector<at::Tensor> tensors, int size) {
  return [tensors = std::move(tensors), size] {
    for (const auto& t : tensors) {
      t.div_(size);
    }
  };
}

// Launches `op`, whose tensors include the stand-ins of `args`: the
// caller's tensors are kept too, the stand-ins of outputs are written back on
// the communicator's stream after the operation (with its other ATen work),
// and the Work's result holds the caller's tensors.
std::shared_ptr<Work> launch_with(internal::NcclEngine& engine, internal::NcclOp op,
                                  const internal::ContiguousArguments& args) {
  if (args.any()) {
    op.tensors = args.keep(std::move(op.tensors));
    op.outputs = args.originals(std::move(op.outputs));
    op.finish = [finish = std::move(op.finish), args] {
      if (finish) {
        finish();
      }
      args.copy_back();
    };
  }
  return engine.launch(std::move(op));
}

} // namespace

// ---- Collectives -------------------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupNCCL::allreduce(const at::Tensor& tensor,
                                                  const AllreduceOptions& options) {
  return allreduce_coalesced({tensor}, options);
}

std::shared_ptr<Work> ProcessGroupNCCL::allreduce_coalesced(const std::vector<at::Tensor>& given_tensors,
                                                            const AllreduceOptions& options) {
  const std::string who = rank_prefix() + " allreduce";
  internal::check_coalesced(given_tensors, who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const std::vector<at::Tensor> tensors = given_tensors.size() == 1
      ? std::vector<at::Tensor>{args.output(given_tensors[0], who, "tensor")}
      : args.outputs(given_tensors, who, "tensors");
  const auto reduction = internal::nccl_reduction(tensors[0].scalar_type(), options.op, who);

  int64_t numel = 0;
  for (const auto& t : tensors) {
    numel += t.numel();
  }

  internal::NcclOp op;
  op.op_name = "allreduce";
  op.fingerprint = internal::Fingerprint{"allreduce", tensors[0].scalar_type(), numel, options.op};
  op.device = device_index_of(tensors[0]);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = tensors;
  op.outputs = tensors;
  // Several tensors are one NCCL group: one launch, fused by NCCL.
  op.issue = [tensors, reduction](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    for (const auto& t : tensors) {
      const size_t count = reduction.count(t);
      if (count > 0) {
        internal::check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), count, reduction.type,
                                           reduction.op, comm, stream),
                             comm, what + ": ncclAllReduce");
      }
    }
  };
  if (reduction.divide_after) {
    op.finish = divide_by(tensors, size());
  }
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::broadcast(const at::Tensor& given_tensor,
                                                  const BroadcastOptions& options) {
  const std::string who = rank_prefix() + " broadcast";
  internal::check_rooted(given_tensor, options.root_rank, size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor tensor = args.output(given_tensor, who, "tensor");
  const int root = options.root_rank;

  internal::NcclOp op;
  op.op_name = "broadcast";
  op.fingerprint =
      internal::Fingerprint{"broadcast", tensor.scalar_type(), tensor.numel(), std::nullopt, root};
  op.device = device_index_of(tensor);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {tensor};
  op.outputs = {tensor};
  op.issue = [tensor, root](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const auto layout = internal::movement_layout(tensor);
    if (layout.count > 0) {
      internal::check_nccl(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), layout.count,
                                         layout.type, root, comm, stream),
                           comm, what + ": ncclBroadcast");
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::reduce(const at::Tensor& given_tensor, const ReduceOptions& options) {
  const std::string who = rank_prefix() + " reduce";
  internal::check_rooted(given_tensor, options.root_rank, size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor tensor = args.output(given_tensor, who, "tensor");
  const auto reduction = internal::nccl_reduction(tensor.scalar_type(), options.op, who);
  const int root = options.root_rank;

  internal::NcclOp op;
  op.op_name = "reduce";
  op.fingerprint = internal::Fingerprint{"reduce", tensor.scalar_type(), tensor.numel(), options.op, root};
  op.device = device_index_of(tensor);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {tensor};
  op.outputs = {tensor};
  op.issue = [tensor, reduction, root](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const size_t count = reduction.count(tensor);
    if (count > 0) {
      internal::check_nccl(ncclReduce(tensor.data_ptr(), tensor.data_ptr(), count, reduction.type,
                                      reduction.op, root, comm, stream),
                           comm, what + ": ncclReduce");
    }
  };
  if (reduction.divide_after && rank() == root) {
    op.finish = divide_by({tensor}, size());
  }
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::allgather(const std::vector<at::Tensor>& given_outputs,
                                                  const at::Tensor& given_input,
                                                  const AllgatherOptions& options) {
  const std::string who = rank_prefix() + " allgather";
  internal::check_allgather(given_outputs, given_input, size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const std::vector<at::Tensor> outputs = args.outputs(given_outputs, who, "outputs");
  const at::Tensor input = args.input(given_input);
  // NCCL gathers into one buffer; the copies into `outputs` follow on the
  // communicator's stream.
  const auto flat = at::empty({size() * input.numel()}, input.options());

  internal::NcclOp op;
  op.op_name = "allgather";
  op.fingerprint = internal::Fingerprint{"allgather", input.scalar_type(), input.numel()};
  op.device = device_index_of(input);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = outputs;
  op.tensors.push_back(input);
  op.tensors.push_back(flat);
  op.outputs = outputs;
  op.issue = [input, flat](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const auto layout = internal::movement_layout(input);
    if (layout.count > 0) {
      internal::check_nccl(ncclAllGather(input.data_ptr(), flat.data_ptr(), layout.count,
                                         layout.type, comm, stream),
                           comm, what + ": ncclAllGather");
    }
  };
  op.finish = [outputs, flat, n = input.numel()] {
    for (size_t r = 0; r < outputs.size(); ++r) {
      outputs[r].view({-1}).copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n));
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::allgather_into_tensor(const at::Tensor& given_output,
                                                              const at::Tensor& given_input,
                                                              const AllgatherOptions& options) {
  const std::string who = rank_prefix() + " allgather_into_tensor";
  internal::check_allgather_into_tensor(given_output, given_input, size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor output = args.output(given_output, who, "output");
  const at::Tensor input = args.input(given_input);

  internal::NcclOp op;
  op.op_name = "allgather_into_tensor";
  op.fingerprint = internal::Fingerprint{"allgather_into_tensor", input.scalar_type(), input.numel()};
  op.device = device_index_of(input);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {output, input};
  op.outputs = {output};
  op.issue = [output, input](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const auto layout = internal::movement_layout(input);
    if (layout.count > 0) {
      internal::check_nccl(ncclAllGather(input.data_ptr(), output.data_ptr(), layout.count,
                                         layout.type, comm, stream),
                           comm, what + ": ncclAllGather");
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::gather(const std::vector<at::Tensor>& given_outputs,
                                               const at::Tensor& given_input,
                                               const GatherOptions& options) {
  const std::string who = rank_prefix() + " gather";
  internal::check_gather(given_outputs, given_input, rank(), options.root_rank, size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const std::vector<at::Tensor> outputs = args.outputs(given_outputs, who, "outputs");
  const at::Tensor input = args.input(given_input);
  const bool is_root = rank() == options.root_rank;
  const int root = options.root_rank;
  const int rank = this->rank();

  internal::NcclOp op;
  op.op_name = "gather";
  op.fingerprint =
      internal::Fingerprint{"gather", input.scalar_type(), input.numel(), std::nullopt, root};
  op.device = device_index_of(input);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = outputs;
  op.tensors.push_back(input);
  op.outputs = outputs;
  // The root receives from every other rank in one group; its own part is a
  // local copy.
  op.issue = [outputs, input, root, rank, is_root](ncclComm_t comm, cudaStream_t stream,
                                                   const std::string& what) {
    const auto layout = internal::movement_layout(input);
    if (layout.count == 0) {
      return;
    }
    if (!is_root) {
      internal::check_nccl(ncclSend(input.data_ptr(), layout.count, layout.type, root, comm, stream),
                           comm, what + ": ncclSend");
      return;
    }
    for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
      if (r == rank) {
        internal::copy_on_stream(outputs[r].data_ptr(), input.data_ptr(), input.nbytes(), stream,
                                 what + ": cudaMemcpyAsync");
      } else {
        internal::check_nccl(ncclRecv(outputs[r].data_ptr(), layout.count, layout.type, r, comm, stream),
                             comm, what + ": ncclRecv");
      }
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::scatter(const at::Tensor& given_output,
                                                const std::vector<at::Tensor>& given_inputs,
                                                const ScatterOptions& options) {
  const std::string who = rank_prefix() + " scatter";
  internal::check_scatter(given_output, given_inputs, rank(), options.root_rank, size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor output = args.output(given_output, who, "output");
  const std::vector<at::Tensor> inputs = args.inputs(given_inputs);
  const bool is_root = rank() == options.root_rank;
  const int root = options.root_rank;
  const int rank = this->rank();

  internal::NcclOp op;
  op.op_name = "scatter";
  op.fingerprint =
      internal::Fingerprint{"scatter", output.scalar_type(), output.numel(), std::nullopt, root};
  op.device = device_index_of(output);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = inputs;
  op.tensors.push_back(output);
  op.outputs = {output};
  op.issue = [output, inputs, root, rank, is_root](ncclComm_t comm, cudaStream_t stream,
                                                   const std::string& what) {
    const auto layout = internal::movement_layout(output);
    if (layout.count == 0) {
      return;
    }
    if (!is_root) {
      internal::check_nccl(ncclRecv(output.data_ptr(), layout.count, layout.type, root, comm, stream),
                           comm, what + ": ncclRecv");
      return;
    }
    for (int r = 0; r < static_cast<int>(inputs.size()); ++r) {
      if (r == rank) {
        internal::copy_on_stream(output.data_ptr(), inputs[r].data_ptr(), output.nbytes(), stream,
                                 what + ": cudaMemcpyAsync");
      } else {
        internal::check_nccl(ncclSend(inputs[r].data_ptr(), layout.count, layout.type, r, comm, stream),
                             comm, what + ": ncclSend");
      }
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::reduce_scatter(const at::Tensor& given_output,
                                                       const std::vector<at::Tensor>& given_inputs,
                                                       const ReduceScatterOptions& options) {
  const std::string who = rank_prefix() + " reduce_scatter";
  internal::check_reduce_scatter(given_output, given_inputs, rank(), size(), who, kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor output = args.output(given_output, who, "output");
  const std::vector<at::Tensor> inputs = args.inputs(given_inputs);
  const auto reduction = internal::nccl_reduction(output.scalar_type(), options.op, who);
  // NCCL reduces one buffer holding every rank's chunk; packing it runs on
  // the caller's stream, which the operation waits for.
  std::vector<at::Tensor> views;
  views.reserve(inputs.size());
  for (const auto& t : inputs) {
    views.push_back(t.reshape({-1}));
  }
  const auto flat = at::cat(views);

  // Chunks may differ in size (inputs[r] is rank r's): NCCL's reduce-scatter
  // takes equal ones, so uneven chunks are one ncclReduce per rank, rooted
  // at that rank, in one group (as PyTorch's NCCL backend does).
  std::vector<int64_t> offsets;
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const auto& t : inputs) {
    offsets.push_back(total);
    counts.push_back(t.numel());
    total += t.numel();
  }
  const bool even = std::all_of(counts.begin(), counts.end(),
                                [&](int64_t c) { return c == counts[0]; });

  internal::NcclOp op;
  op.op_name = "reduce_scatter";
  op.fingerprint = internal::Fingerprint{"reduce_scatter", output.scalar_type(), total, options.op};
  op.device = device_index_of(output);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = inputs;
  op.tensors.push_back(output);
  op.tensors.push_back(flat);
  op.outputs = {output};
  op.issue = [output, flat, reduction, even, offsets, counts, rank = rank()](
                 ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    if (even) {
      const size_t count = reduction.count(output);
      if (count > 0) {
        internal::check_nccl(ncclReduceScatter(flat.data_ptr(), output.data_ptr(), count,
                                               reduction.type, reduction.op, comm, stream),
                             comm, what + ": ncclReduceScatter");
      }
      return;
    }
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] == 0) {
        continue;
      }
      const at::Tensor chunk = flat.narrow(0, offsets[r], counts[r]);
      // Only the root's receive buffer is written.
      void* receive = static_cast<int>(r) == rank ? output.data_ptr() : chunk.data_ptr();
      internal::check_nccl(ncclReduce(chunk.data_ptr(), receive, reduction.count(chunk),
                                      reduction.type, reduction.op, static_cast<int>(r), comm,
                                      stream),
                           comm, what + ": ncclReduce");
    }
  };
  if (reduction.divide_after) {
    op.finish = divide_by({output}, size());
  }
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::alltoall(const at::Tensor& given_output, const at::Tensor& given_input,
                                                 const AlltoallOptions& options) {
  const std::string who = rank_prefix() + " alltoall";
  const auto splits = internal::check_alltoall(given_output, given_input, size(), options, who, kNcclRules);
  if (splits.uneven) {
    // Note [Uneven all-to-all]: the table of splits first, here a collective
    // of its own that this call waits for (NCCL runs on streams).
    const auto mine = splits.agreement_entry();
    auto entry = at::tensor(mine, at::kLong).to(given_input.device());
    auto table = at::empty({static_cast<int64_t>(mine.size()) * size()}, entry.options());
    allgather_into_tensor(table, entry, AllgatherOptions{options.timeout})->wait();
    const auto host = table.cpu();
    internal::check_alltoall_agreement(host.data_ptr<int64_t>(), size(), who);
  }
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor output = args.output(given_output, who, "output");
  const at::Tensor input = args.input(given_input);
  const int size = this->size();
  const int rank = this->rank();
  if (splits.uneven) {
    internal::NcclOp op;
    op.op_name = "alltoall";
    op.fingerprint = internal::Fingerprint{"alltoall", input.scalar_type(), internal::Fingerprint::kUneven};
    op.device = device_index_of(input);
    op.timeout = resolve_timeout(options.timeout);
    op.tensors = {output, input};
    op.outputs = {output};
    // As below, with each peer's own count, moved as bytes.
    const auto element = static_cast<size_t>(input.element_size());
    op.issue = [output, input, size, rank, splits, element](ncclComm_t comm, cudaStream_t stream,
                                                           const std::string& what) {
      auto* in = static_cast<uint8_t*>(input.data_ptr());
      auto* out = static_cast<uint8_t*>(output.data_ptr());
      for (int r = 0; r < size; ++r) {
        const size_t send = static_cast<size_t>(splits.send_counts[r]) * element;
        const size_t recv = static_cast<size_t>(splits.recv_counts[r]) * element;
        uint8_t* from = in + static_cast<size_t>(splits.send_offsets[r]) * element;
        uint8_t* to = out + static_cast<size_t>(splits.recv_offsets[r]) * element;
        if (r == rank) {
          if (send > 0) {
            internal::copy_on_stream(to, from, send, stream, what + ": cudaMemcpyAsync");
          }
          continue;
        }
        if (send > 0) {
          internal::check_nccl(ncclSend(from, send, ncclUint8, r, comm, stream), comm, what + ": ncclSend");
        }
        if (recv > 0) {
          internal::check_nccl(ncclRecv(to, recv, ncclUint8, r, comm, stream), comm, what + ": ncclRecv");
        }
      }
    };
    return launch_with(impl_->engine, std::move(op), args);
  }

  internal::NcclOp op;
  op.op_name = "alltoall";
  op.fingerprint = internal::Fingerprint{"alltoall", input.scalar_type(), input.numel()};
  op.device = device_index_of(input);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {output, input};
  op.outputs = {output};
  // One send and one receive per peer, in one group so that they all
  // progress together; the chunk for this rank itself is a local copy.
  op.issue = [output, input, size, rank](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const auto layout = internal::movement_layout(input);
    if (layout.count == 0) {
      return;
    }
    const size_t chunk_count = layout.count / static_cast<size_t>(size);
    const size_t chunk_bytes = static_cast<size_t>(input.nbytes()) / static_cast<size_t>(size);
    for (int r = 0; r < size; ++r) {
      if (r == rank) {
        internal::copy_on_stream(chunk(output, r, chunk_bytes), chunk(input, r, chunk_bytes),
                                 chunk_bytes, stream, what + ": cudaMemcpyAsync");
        continue;
      }
      internal::check_nccl(ncclSend(chunk(input, r, chunk_bytes), chunk_count, layout.type, r, comm, stream),
                           comm, what + ": ncclSend");
      internal::check_nccl(ncclRecv(chunk(output, r, chunk_bytes), chunk_count, layout.type, r, comm, stream),
                           comm, what + ": ncclRecv");
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::vector<std::shared_ptr<Work>> ProcessGroupNCCL::batch_point_to_point(const std::vector<PointToPointOp>& ops,
                                                                          std::chrono::milliseconds timeout) {
  const std::string who = rank_prefix() + " batch_isend_irecv";
  DDP_CHECK(!ops.empty(), who, ": no ops given; expected at least one send or recv");
  internal::ContiguousArguments args;
  std::vector<PointToPointOp> dense;
  std::string detail;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& given = ops[i];
    const std::string name = c10::str("ops[", i, "]");
    internal::check_point_to_point(given.tensor, given.peer, given.tag, rank(), size(), who + ": " + name,
                                   given.is_send ? "destination" : "source", kNcclRules);
    PointToPointOp op = given;
    op.tensor = given.is_send ? args.input(given.tensor) : args.output(given.tensor, who, name);
    detail += c10::str(i == 0 ? "" : ", ", given.is_send ? "send to " : "recv from ", given.peer);
    dense.push_back(std::move(op));
  }
  internal::NcclOp op;
  op.op_name = "batch_isend_irecv";
  op.peer_detail = detail;
  op.collective = false;
  op.device = device_index_of(dense.front().tensor);
  op.timeout = resolve_timeout(timeout);
  for (const auto& item : dense) {
    op.tensors.push_back(item.tensor);
    if (!item.is_send) {
      op.outputs.push_back(item.tensor);
    }
  }
  // Every send and receive inside the engine's one ncclGroupStart/End.
  op.issue = [dense](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    for (const auto& item : dense) {
      const auto layout = internal::movement_layout(item.tensor);
      if (layout.count == 0) {
        continue;
      }
      if (item.is_send) {
        internal::check_nccl(ncclSend(item.tensor.data_ptr(), layout.count, layout.type, item.peer, comm, stream),
                             comm, what + ": ncclSend");
      } else {
        internal::check_nccl(ncclRecv(item.tensor.data_ptr(), layout.count, layout.type, item.peer, comm, stream),
                             comm, what + ": ncclRecv");
      }
    }
  };
  auto work = launch_with(impl_->engine, std::move(op), args);
  return std::vector<std::shared_ptr<Work>>(ops.size(), work);
}

std::shared_ptr<Work> ProcessGroupNCCL::barrier(const BarrierOptions& options) {
  const std::string who = rank_prefix() + " barrier";
  // An allreduce of one element on the group's device; its Work blocks the
  // CPU in wait(), which is what a barrier is for.
  const int device = impl_->engine.bind_device(-1, who);
  const auto token = at::zeros({1}, at::TensorOptions()
                                        .dtype(at::kFloat)
                                        .device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))));

  internal::NcclOp op;
  op.op_name = "barrier";
  op.fingerprint = internal::Fingerprint{"barrier"};
  op.device = device;
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {token};
  op.blocking_wait = true;
  op.issue = [token](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    internal::check_nccl(ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum,
                                       comm, stream),
                         comm, what + ": ncclAllReduce");
  };
  return impl_->engine.launch(std::move(op));
}

// ---- Point to point --------------------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupNCCL::send(const at::Tensor& given_tensor, int dst_rank,
                                             const PointToPointOptions& options) {
  const std::string who = rank_prefix() + " send";
  internal::check_point_to_point(given_tensor, dst_rank, options.tag, rank(), size(), who, "destination",
                                 kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor tensor = args.input(given_tensor);

  internal::NcclOp op;
  op.op_name = "send";
  op.peer_detail = c10::str("to rank ", dst_rank, " (tag ", options.tag, ")");
  op.collective = false;
  op.device = device_index_of(tensor);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {tensor};
  op.outputs = {tensor};
  op.issue = [tensor, dst_rank](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const auto layout = internal::movement_layout(tensor);
    if (layout.count > 0) {
      internal::check_nccl(ncclSend(tensor.data_ptr(), layout.count, layout.type, dst_rank, comm, stream),
                           comm, what + ": ncclSend");
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

std::shared_ptr<Work> ProcessGroupNCCL::recv(const at::Tensor& given_tensor, int src_rank,
                                             const PointToPointOptions& options) {
  const std::string who = rank_prefix() + " recv";
  internal::check_point_to_point(given_tensor, src_rank, options.tag, rank(), size(), who, "source",
                                 kNcclRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const at::Tensor tensor = args.output(given_tensor, who, "tensor");

  internal::NcclOp op;
  op.op_name = "recv";
  op.peer_detail = c10::str("from rank ", src_rank, " (tag ", options.tag, ")");
  op.collective = false;
  op.device = device_index_of(tensor);
  op.timeout = resolve_timeout(options.timeout);
  op.tensors = {tensor};
  op.outputs = {tensor};
  op.issue = [tensor, src_rank](ncclComm_t comm, cudaStream_t stream, const std::string& what) {
    const auto layout = internal::movement_layout(tensor);
    if (layout.count > 0) {
      internal::check_nccl(ncclRecv(tensor.data_ptr(), layout.count, layout.type, src_rank, comm, stream),
                           comm, what + ": ncclRecv");
    }
  };
  return launch_with(impl_->engine, std::move(op), args);
}

} // namespace ddp
