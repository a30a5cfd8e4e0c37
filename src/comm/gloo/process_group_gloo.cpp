// The Gloo backend.
//
// How it works. `create` meets the other ranks through the Store (see
// gloo_rendezvous.h) and builds one Gloo context: a full mesh of TCP pairs.
// Each collective call checks its arguments on the caller's thread, takes
// the next sequence number, and queues a `Task` (a closure over the tensors)
// for the group's workers. They run tasks one at a time in queue order, which
// is issue order, so every rank runs the same collectives
// in the same order: the ProcessGroup contract turned into an execution
// order. The sequence number names the task in errors and, with a hash of
// the call's fingerprint, becomes the Gloo tag of the task's messages; the
// monitor thread turns a mismatch between ranks into an error (Note
// [Collective fingerprints]).
//
// Every task calls one Gloo algorithm (a sparse allreduce: three allgathers,
// Note [Sparse allreduce]) with the deadline of the call. When one
// fails (a timeout, a peer that closed its connection), the worker converts
// Gloo's exception into our CommError family, fails that task, and marks the
// group broken: queued and later tasks then fail at once with the first error,
// because peers may be stuck mid-collective and no later collective could
// line up.
//
// CUDA tensors are staged: copied to pinned host memory before the task and
// back after it (`HostStaging`), in the order that Note [Gloo and CUDA
// streams] in comm/host_staging.h explains. send/recv bypass the queue: they post the transfer at once on
// Gloo's unbound buffers and complete in `Work::wait`, both on the caller's
// thread and current stream.
//
// Files: this one has the collectives (argument checks, the closures they
// queue); process_group_gloo_impl.h the queue, the workers, the monitor and
// the conversion of Gloo's failures (gloo_errors.h reads Gloo's messages);
// gloo_sparse.cpp the sparse allreduce; gloo_point_to_point.cpp send/recv.

#include <ddp/comm/process_group_gloo.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <ddp/comm/error.h>

#include "comm/alltoall_splits.h"
#include "comm/collective_checks.h"
#include "comm/complex_arguments.h"
#include "comm/fingerprint.h"
#include "comm/gloo/gloo_api.h"
#include "comm/gloo/gloo_exchange_allreduce.h"
#include "comm/contiguous_arguments.h"
#include "comm/gloo/gloo_point_to_point.h"
#include "comm/gloo/gloo_rendezvous.h"
#include "comm/gloo/gloo_sparse.h"
#include "comm/gloo/gloo_words.h"
#include "comm/gloo/process_group_gloo_impl.h"
#include "comm/host_staging.h"
#include "comm/gloo/sigpipe_guard.h"
#include "comm/reduce_kernels.h"
#include "comm/reduce_targets.h"
#include "internal/check.h"

namespace ddp {

namespace {

// Gloo's allgather of `input` (contiguous, CPU) into `output`.
void allgather_words(const std::shared_ptr<gloo::Context>& context, const at::Tensor& input,
                     const at::Tensor& output, uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllgatherOptions o(context);
  internal::set_input(o, input);
  internal::set_output(o, output);
  o.setTag(tag);
  o.setTimeout(timeout);
  gloo::allgather(o);
}

// Slot prefix of send/recv; Gloo's own algorithms use 0x01 to 0x08.
constexpr uint8_t kPointToPointSlotPrefix = 0x20;

} // namespace

// ---- Construction ------------------------------------------------------------

std::shared_ptr<ProcessGroupGloo> ProcessGroupGloo::create(
    std::shared_ptr<Store> store, int rank, int size, const ProcessGroupGlooOptions& options) {
  return std::make_shared<ProcessGroupGloo>(PrivateTag{}, std::move(store), rank, size, options);
}

ProcessGroupGloo::ProcessGroupGloo(PrivateTag, std::shared_ptr<Store> store, int rank, int size,
                                   const ProcessGroupGlooOptions& options)
    : ProcessGroup(rank, size, options.timeout()) {
  DDP_CHECK(store != nullptr, rank_prefix(), " ProcessGroupGloo: the store is null");
  set_supports_sparse_allreduce(true); // Note [Sparse allreduce]
  impl_ = std::make_unique<Impl>(*this, std::move(store), options);
}

ProcessGroupGloo::~ProcessGroupGloo() = default;

void ProcessGroupGloo::wait_for_pending_work() {
  impl_->wait_until_idle();
}

// ---- Argument checks -----------------------------------------------------------

namespace {

void check_device_and_dtype(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.is_cpu() || t.is_cuda(), who, ": ", what, " is on device ", t.device(),
            "; the Gloo backend takes CPU or CUDA tensors");
  DDP_CHECK(internal::is_supported_dtype(t.scalar_type()), who, ": ", what, " has dtype ",
            t.scalar_type(), ", which the Gloo backend does not support");
}

// Checks one tensor argument; `who` is "[rank R/W] op", `what` names the
// argument ("tensor", "outputs[2]").
void check_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  internal::check_strided(t, who, what,
                          "the Gloo backend reduces sparse tensors only in allreduce, one tensor "
                          "per call");
  check_device_and_dtype(t, who, what);
}

// The sparse COO tensor of an allreduce (see Note [Sparse allreduce]).
void check_sparse_tensor(const at::Tensor& t, const std::string& who, const std::string& what) {
  DDP_CHECK(t.defined(), who, ": ", what, " is an undefined tensor");
  DDP_INTERNAL_ASSERT(t.is_sparse());
  check_device_and_dtype(t, who, what);
}

// Gloo's rules for the checks of collective_checks.h: CPU or CUDA tensors,
// which may differ in device within an operation (CUDA ones are staged);
// sparse COO tensors in allreduce.
constexpr internal::TensorRules kGlooRules{&check_tensor, nullptr, &check_sparse_tensor};

internal::ReduceKernel checked_kernel(at::ScalarType dtype, ReduceOp op, const std::string& who) {
  auto kernel = internal::reduce_kernel(dtype, op);
  DDP_CHECK(kernel != nullptr, who, ": ", to_string(op), " is not defined for dtype ", dtype,
            op == ReduceOp::kAvg ? "; AVG needs a floating-point tensor (use SUM and divide)"
                                 : "; bitwise operations need an integer or bool tensor");
  return kernel;
}

} // namespace

// ---- Collectives -----------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupGloo::allreduce(const at::Tensor& tensor,
                                                  const AllreduceOptions& options) {
  return allreduce_coalesced({tensor}, options);
}

std::shared_ptr<Work> ProcessGroupGloo::allreduce_coalesced(
    const std::vector<at::Tensor>& tensors, const AllreduceOptions& options) {
  const std::string who = rank_prefix() + " allreduce";
  if (internal::has_complex(tensors)) { // Note [Complex arguments]
    internal::check_complex_reduction(tensors, options.op, who);
    internal::ComplexArguments complex;
    return complex.given_back(allreduce_coalesced(complex.real(tensors), options));
  }
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    internal::check_sparse_allreduce(tensors[0], options.op, who, kGlooRules);
    const at::Tensor tensor = tensors[0];
    auto context = impl_->context();
    // Sizes that differ are the collective's own error, after which the group
    // stays usable (Note [Sparse allreduce]); the dtype is not checked there.
    internal::Fingerprint fingerprint{"allreduce", tensor.scalar_type(), internal::Fingerprint::kSparse,
                                      options.op};
    return impl_->enqueue_named(
        std::move(fingerprint), resolve_timeout(options.timeout), tensors,
        [tensor, context](uint32_t tag, std::chrono::milliseconds timeout, const std::string& name) {
          internal::sparse_allreduce(context, tensor, name, tag, timeout);
          return std::vector<at::Tensor>{tensor};
        });
  }
  return allreduce_dense(tensors, options, nullptr, 1.0);
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_gradients(const at::Tensor& buffer, std::vector<ReduceTarget> gradients,
                                                         double scale, std::chrono::milliseconds timeout) {
  if (internal::has_complex(buffer)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    auto real_buffer = complex.real_buffer(buffer);
    return complex.given_back(reduce_gradients(
        real_buffer, internal::ComplexArguments::real_targets(std::move(gradients)), scale, timeout));
  }
  auto checked =
      internal::checked_reduce_targets(buffer, std::move(gradients), rank_prefix() + " reduce_gradients");
  AllreduceOptions options;
  options.timeout = timeout;
  return allreduce_dense({buffer}, options, std::make_shared<const std::vector<ReduceTarget>>(std::move(checked)),
                         scale);
}

bool ProcessGroupGloo::reduces_gradients_in_place() const {
  return impl_->shared()->cross_memory();
}

std::shared_ptr<Work> ProcessGroupGloo::allreduce_dense(const std::vector<at::Tensor>& tensors,
                                                        const AllreduceOptions& options,
                                                        std::shared_ptr<const std::vector<ReduceTarget>> gradients,
                                                        double scale) {
  const std::string who = rank_prefix() + " allreduce";
  internal::check_coalesced(tensors, who, kGlooRules);
  // Stand-ins for non-contiguous tensors: Note [Non-contiguous arguments].
  internal::ContiguousArguments args;
  const std::vector<at::Tensor> dense = tensors.size() == 1
      ? std::vector<at::Tensor>{args.output(tensors[0], who, "tensor")}
      : args.outputs(tensors, who, "tensors");
  auto kernel = checked_kernel(tensors[0].scalar_type(), options.op, who);
  const ReduceOp op = options.op;
  const int size = this->size();
  auto context = impl_->context();
  int64_t numel = 0;
  for (const auto& t : tensors) {
    numel += t.numel();
  }
  internal::Fingerprint fingerprint{"allreduce", tensors[0].scalar_type(), numel, op};
  // The same choice on every rank: it depends on the size alone.
  const bool try_shared =
      internal::use_shared_allreduce(static_cast<size_t>(numel) * tensors[0].element_size(), size);
  internal::shm::SharedBuffers* shared = impl_->shared(); // outlives the task
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep(dense),
      args.wrap([tensors = dense, kernel, op, size, context, try_shared, shared, targets = gradients, scale](
                    uint32_t tag, std::chrono::milliseconds timeout) {
        // Note [Shared buffers]: every rank asks whether they all pass the
        // same range of one shared buffer once the group has any, and
        // whether they all offer gradients to read where they lie (Note
        // [Gradients read where they lie]).
        if (try_shared && shared->any_allocated()) {
          const auto where =
              tensors.size() == 1 ? shared->locate(tensors[0]) : internal::shm::SharedLocation{};
          internal::GlooCoordinator coordinator(context, tag, timeout);
          bool direct = false;
          bool any_gradients = false;
          const bool same =
              shared->agree(coordinator, where, static_cast<int64_t>(tensors[0].nbytes()),
                            targets ? shared->direct_offer(tensors[0], *targets) : -1, &direct, &any_gradients);
          if (direct && shared->reduce_direct(coordinator, tensors[0], *targets, scale)) {
            return tensors;
          }
          if (same) {
            if (any_gradients) {
              // Each rank's gradients into its buffer before any peer reads it.
              if (targets) {
                internal::scale_into(tensors[0], *targets, scale);
              }
              coordinator.barrier();
            }
            shared->allreduce(coordinator, tensors[0], where, kernel, op == ReduceOp::kAvg,
                              internal::shm::ReduceOrder::kGlooRing, targets.get());
            return tensors;
          }
        }
        if (targets) {
          internal::scale_into(tensors[0], *targets, scale);
        }
        internal::HostStaging staging;
        // One tensor is reduced in place; several are packed into one buffer
        // so that they cost one collective.
        at::Tensor flat;
        if (tensors.size() == 1) {
          flat = staging.in(tensors[0]);
        } else {
          std::vector<at::Tensor> views;
          for (const auto& t : tensors) {
            views.push_back(t.reshape({-1}));
          }
          flat = staging.in(at::cat(views));
        }
        if (flat.numel() > 0) {
          if (internal::use_exchange_allreduce(flat.nbytes(), size)) {
            // Small: one step instead of the ring's 2 (n - 1); Note
            // [Exchange allreduce].
            internal::exchange_allreduce(context, flat.data_ptr(), static_cast<size_t>(flat.numel()),
                                         flat.nbytes(), kernel, tag, timeout);
          } else {
            gloo::AllreduceOptions o(context);
            internal::set_output(o, flat);
            o.setReduceFunction(kernel);
            o.setTag(tag);
            o.setTimeout(timeout);
            gloo::allreduce(o);
          }
          if (op == ReduceOp::kAvg) {
            flat.div_(size);
          }
        }
        if (tensors.size() == 1) {
          staging.copy_back();
          if (targets) {
            internal::copy_to_targets(tensors[0], *targets);
          }
        } else {
          int64_t offset = 0;
          for (const auto& t : tensors) {
            t.view({-1}).copy_(flat.narrow(0, offset, t.numel()));
            offset += t.numel();
          }
        }
        return tensors;
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(const at::Tensor& tensor,
                                                  const BroadcastOptions& options) {
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(broadcast(complex.real(tensor), options));
  }
  const std::string who = rank_prefix() + " broadcast";
  internal::check_rooted(tensor, options.root_rank, size(), who, kGlooRules);
  const int root = options.root_rank;
  auto context = impl_->context();
  internal::Fingerprint fingerprint{"broadcast", tensor.scalar_type(), tensor.numel(), std::nullopt, root};
  internal::ContiguousArguments args;
  const at::Tensor dense = args.output(tensor, who, "tensor");
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep({dense}),
      args.wrap([tensor = dense, root, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host = staging.in(tensor);
        if (host.numel() > 0) {
          gloo::BroadcastOptions o(context);
          internal::set_output(o, host);
          o.setRoot(root);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::broadcast(o);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{tensor};
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::reduce(const at::Tensor& tensor,
                                               const ReduceOptions& options) {
  const std::string who = rank_prefix() + " reduce";
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    internal::check_complex_reduction(tensor, options.op, who);
    internal::ComplexArguments complex;
    return complex.given_back(reduce(complex.real(tensor), options));
  }
  internal::check_rooted(tensor, options.root_rank, size(), who, kGlooRules);
  auto kernel = checked_kernel(tensor.scalar_type(), options.op, who);
  const int root = options.root_rank;
  const ReduceOp op = options.op;
  const int size = this->size();
  const int rank = this->rank();
  auto context = impl_->context();
  internal::Fingerprint fingerprint{"reduce", tensor.scalar_type(), tensor.numel(), op, root};
  internal::ContiguousArguments args;
  const at::Tensor dense = args.output(tensor, who, "tensor");
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep({dense}),
      args.wrap([tensor = dense, kernel, root, op, size, rank, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host = staging.in(tensor);
        if (host.numel() > 0) {
          gloo::ReduceOptions o(context);
          internal::set_output(o, host);
          o.setRoot(root);
          o.setReduceFunction(kernel);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::reduce(o);
          if (op == ReduceOp::kAvg && rank == root) {
            host.div_(size);
          }
        }
        staging.copy_back();
        return std::vector<at::Tensor>{tensor};
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::allgather(const std::vector<at::Tensor>& outputs,
                                                  const at::Tensor& input,
                                                  const AllgatherOptions& options) {
  if (internal::has_complex(input) || internal::has_complex(outputs)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(allgather(complex.real(outputs), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " allgather";
  internal::check_allgather(outputs, input, size(), who, kGlooRules);
  auto context = impl_->context();
  internal::ContiguousArguments args;
  std::vector<at::Tensor> keep = args.outputs(outputs, who, "outputs");
  keep.push_back(args.input(input));
  internal::Fingerprint fingerprint{"allgather", input.scalar_type(), input.numel()};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep(keep),
      args.wrap([outputs = std::vector<at::Tensor>(keep.begin(), keep.end() - 1), input = keep.back(),
                 context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host_input = staging.in(input);
        auto flat = at::empty({static_cast<int64_t>(outputs.size()) * input.numel()},
                              host_input.options());
        if (input.numel() > 0) {
          allgather_words(context, host_input, flat, tag, timeout);
        }
        for (size_t r = 0; r < outputs.size(); ++r) {
          outputs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()));
        }
        return outputs;
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::allgather_into_tensor(const at::Tensor& output,
                                                              const at::Tensor& input,
                                                              const AllgatherOptions& options) {
  if (internal::has_complex(input) || internal::has_complex(output)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(allgather_into_tensor(complex.real(output), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " allgather_into_tensor";
  internal::check_allgather_into_tensor(output, input, size(), who, kGlooRules);
  internal::ContiguousArguments args;
  const at::Tensor dense_output = args.output(output, who, "output");
  const at::Tensor dense_input = args.input(input);
  const int64_t bytes = static_cast<int64_t>(input.nbytes());
  // The same choice on every rank: it depends on the size alone.
  const bool try_shared = internal::use_shared_allreduce(static_cast<size_t>(bytes), size());
  internal::shm::SharedBuffers* shared = impl_->shared(); // outlives the task
  auto context = impl_->context();
  internal::Fingerprint fingerprint{"allgather_into_tensor", input.scalar_type(), input.numel()};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep({dense_output, dense_input}),
      args.wrap([output = dense_output, input = dense_input, context, try_shared, shared,
                 bytes](uint32_t tag, std::chrono::milliseconds timeout) {
        // Note [Shared buffers]: the inputs may all be in shared memory (one
        // host; every rank knows whether the group spans hosts).
        if (try_shared && shared->any_allocated() && !shared->multi_host()) {
          const auto where = shared->locate_gather_input(input, output);
          internal::GlooCoordinator coordinator(context, tag, timeout);
          if (shared->agree(coordinator, where, bytes)) {
            shared->allgather(coordinator, output, where, bytes);
            return std::vector<at::Tensor>{output};
          }
        }
        internal::HostStaging staging;
        auto host_input = staging.in(input);
        auto host_output = staging.in(output);
        if (input.numel() > 0) {
          allgather_words(context, host_input, host_output, tag, timeout);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

namespace {

// allocate_collective_buffer's and allocate_common_buffer's collective:
// undefined where the memory cannot be shared. (A template: the group's
// Impl is private to it.)
template <typename Impl>
at::Tensor allocate_shared(Impl& impl, const char* what, int64_t numel,
                           const at::TensorOptions& options, std::chrono::milliseconds timeout, bool common) {
  auto buffer = std::make_shared<at::Tensor>();
  internal::shm::SharedBuffers* shared = impl.shared(); // outlives the task
  const bool wanted = impl.shared_wanted(numel * static_cast<int64_t>(options.dtype().itemsize()));
  auto context = impl.context();
  auto work = impl.enqueue(
      internal::Fingerprint{what, options.dtype().toScalarType(), numel}, timeout, {},
      [buffer, shared, numel, options, wanted, context, common](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::GlooCoordinator coordinator(context, tag, timeout);
        *buffer = shared->allocate(coordinator, numel, options, wanted, common);
        return std::vector<at::Tensor>{};
      });
  work->wait();
  return *buffer;
}

} // namespace

at::Tensor ProcessGroupGloo::allocate_collective_buffer(int64_t numel, const at::TensorOptions& options) {
  const std::string who = rank_prefix() + " allocate_collective_buffer";
  DDP_CHECK(numel >= 0, who, ": numel must not be negative (got ", numel, ")");
  // The same choice on every rank, given the same arguments; whether this
  // rank wants the buffer shared is asked inside (Note [Shared buffers]).
  if (size() < 2 || options.device().type() != c10::kCPU || numel == 0) {
    return ProcessGroup::allocate_collective_buffer(numel, options);
  }
  auto buffer = allocate_shared(*impl_, "allocate_collective_buffer", numel, options, timeout(), false);
  return buffer.defined() ? buffer : ProcessGroup::allocate_collective_buffer(numel, options);
}

at::Tensor ProcessGroupGloo::allocate_common_buffer(int64_t numel, const at::TensorOptions& options) {
  const std::string who = rank_prefix() + " allocate_common_buffer";
  DDP_CHECK(numel >= 0, who, ": numel must not be negative (got ", numel, ")");
  if (size() < 2 || options.device().type() != c10::kCPU || numel == 0) {
    return {};
  }
  return allocate_shared(*impl_, "allocate_common_buffer", numel, options, timeout(), true);
}

bool ProcessGroupGloo::is_shared_buffer(const at::Tensor& tensor) const {
  return tensor.defined() && impl_->shared()->locate(tensor).id >= 0;
}

GlooSharedMemoryStats ProcessGroupGloo::shared_memory_stats() const {
  const auto stats = impl_->shared()->stats();
  return {stats.buffers, stats.bytes, stats.allreduces, stats.allgathers, stats.direct, stats.reduce_scatters};
}

std::shared_ptr<Work> ProcessGroupGloo::gather(const std::vector<at::Tensor>& outputs,
                                               const at::Tensor& input,
                                               const GatherOptions& options) {
  if (internal::has_complex(input) || internal::has_complex(outputs)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(gather(complex.real(outputs), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " gather";
  internal::check_gather(outputs, input, rank(), options.root_rank, size(), who, kGlooRules);
  const bool is_root = rank() == options.root_rank;
  const int root = options.root_rank;
  const int size = this->size();
  auto context = impl_->context();
  internal::ContiguousArguments args;
  std::vector<at::Tensor> keep = args.outputs(outputs, who, "outputs");
  keep.push_back(args.input(input));
  internal::Fingerprint fingerprint{"gather", input.scalar_type(), input.numel(), std::nullopt, root};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep(keep),
      args.wrap([outputs = std::vector<at::Tensor>(keep.begin(), keep.end() - 1), input = keep.back(),
                 root, size, is_root, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host_input = staging.in(input);
        at::Tensor flat;
        if (input.numel() > 0) {
          gloo::GatherOptions o(context);
          internal::set_input(o, host_input);
          if (is_root) {
            flat = at::empty({size * input.numel()}, host_input.options());
            internal::set_output(o, flat);
          }
          o.setRoot(root);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::gather(o);
          if (is_root) {
            for (size_t r = 0; r < outputs.size(); ++r) {
              outputs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()));
            }
          }
        }
        return outputs;
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::scatter(const at::Tensor& output,
                                                const std::vector<at::Tensor>& inputs,
                                                const ScatterOptions& options) {
  if (internal::has_complex(output) || internal::has_complex(inputs)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(scatter(complex.real(output), complex.real(inputs), options));
  }
  const std::string who = rank_prefix() + " scatter";
  internal::check_scatter(output, inputs, rank(), options.root_rank, size(), who, kGlooRules);
  const bool is_root = rank() == options.root_rank;
  const int root = options.root_rank;
  auto context = impl_->context();
  internal::ContiguousArguments args;
  std::vector<at::Tensor> keep = args.inputs(inputs);
  keep.push_back(args.output(output, who, "output"));
  internal::Fingerprint fingerprint{"scatter", output.scalar_type(), output.numel(), std::nullopt, root};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep(keep),
      args.wrap([output = keep.back(), inputs = std::vector<at::Tensor>(keep.begin(), keep.end() - 1),
                 root, is_root, context](uint32_t tag, std::chrono::milliseconds timeout) {
        internal::HostStaging staging;
        auto host_output = staging.in(output);
        if (output.numel() > 0) {
          gloo::ScatterOptions o(context);
          std::vector<at::Tensor> host_inputs;
          if (is_root) {
            std::vector<uint8_t*> pointers;
            for (const auto& t : inputs) {
              host_inputs.push_back(staging.in(t));
              pointers.push_back(static_cast<uint8_t*>(host_inputs.back().data_ptr()));
            }
            o.setInputs<uint8_t>(pointers, static_cast<size_t>(output.nbytes()));
          }
          o.setOutput<uint8_t>(static_cast<uint8_t*>(host_output.data_ptr()),
                               static_cast<size_t>(output.nbytes()));
          o.setRoot(root);
          o.setTag(tag);
          o.setTimeout(timeout);
          gloo::scatter(o);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter(const at::Tensor& output,
                                                       const std::vector<at::Tensor>& inputs,
                                                       const ReduceScatterOptions& options) {
  const std::string who = rank_prefix() + " reduce_scatter";
  if (internal::has_complex(output) || internal::has_complex(inputs)) { // Note [Complex arguments]
    internal::check_complex_reduction(inputs, options.op, who);
    internal::ComplexArguments complex;
    return complex.given_back(reduce_scatter(complex.real(output), complex.real(inputs), options));
  }
  internal::check_reduce_scatter(output, inputs, rank(), size(), who, kGlooRules);
  auto kernel = checked_kernel(output.scalar_type(), options.op, who);
  const ReduceOp op = options.op;
  const int size = this->size();
  auto context = impl_->context();
  internal::ContiguousArguments args;
  std::vector<at::Tensor> keep = args.inputs(inputs);
  keep.push_back(args.output(output, who, "output"));
  int64_t total = 0;
  for (const auto& t : inputs) {
    total += t.numel();
  }
  // The same choice on every rank: it depends on the size alone.
  const int64_t bytes = total * static_cast<int64_t>(output.element_size());
  const bool try_shared = internal::use_shared_allreduce(static_cast<size_t>(bytes), size);
  internal::shm::SharedBuffers* shared = impl_->shared(); // outlives the task
  // See Note [Direct reduce-scatter] in gloo_exchange_allreduce.cpp.
  internal::Fingerprint fingerprint{"reduce_scatter", output.scalar_type(), total, op};
  return impl_->enqueue(
      std::move(fingerprint), resolve_timeout(options.timeout), args.keep(keep),
      args.wrap([output = keep.back(), inputs = std::vector<at::Tensor>(keep.begin(), keep.end() - 1),
                 kernel, op, size, context, try_shared, shared,
                 bytes](uint32_t tag, std::chrono::milliseconds timeout) {
        // Note [Shared buffers]: the inputs may lie in shared memory (one
        // host; every rank knows whether the group spans hosts).
        if (try_shared && shared->any_allocated() && !shared->multi_host()) {
          const auto where = shared->locate_scatter_inputs(inputs, output);
          internal::GlooCoordinator coordinator(context, tag, timeout);
          if (shared->agree(coordinator, where, bytes)) {
            shared->reduce_scatter(coordinator, output, where, kernel, op == ReduceOp::kAvg);
            return std::vector<at::Tensor>{output};
          }
        }
        // CUDA inputs are read through pinned host copies, and the output is
        // written to a pinned buffer copied back once (Note [Gloo and CUDA
        // streams]); neither is copied the other way.
        internal::HostStaging staging;
        std::vector<at::Tensor> hosts;
        std::vector<const void*> data;
        std::vector<size_t> counts;
        for (const auto& t : inputs) {
          hosts.push_back(staging.read(t)); // contiguous already (ContiguousArguments)
          data.push_back(hosts.back().data_ptr());
          counts.push_back(static_cast<size_t>(t.numel()));
        }
        auto chunk = staging.write(output);
        internal::direct_reduce_scatter(context, data, counts, output.element_size(), chunk.data_ptr(),
                                        kernel, tag, timeout);
        if (op == ReduceOp::kAvg) {
          chunk.div_(size);
        }
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::alltoall(const at::Tensor& output, const at::Tensor& input,
                                                 const AlltoallOptions& options) {
  if (internal::has_complex(output) || internal::has_complex(input)) { // Note [Complex arguments]
    internal::ComplexArguments complex;
    return complex.given_back(alltoall(complex.real(output), complex.real(input), options));
  }
  const std::string who = rank_prefix() + " alltoall";
  const auto layout = internal::check_alltoall(output, input, size(), options, who, kGlooRules);
  internal::ContiguousArguments args;
  const at::Tensor dense_output = args.output(output, who, "output");
  const at::Tensor dense_input = args.input(input);
  if (!layout.uneven) {
    return impl_->enqueue_input_output<gloo::AlltoallOptions>(
        "alltoall", resolve_timeout(options.timeout), dense_output, dense_input, args, &gloo::alltoall);
  }
  // Note [Uneven all-to-all]: the table of every rank's splits, then the
  // exchange, in one task.
  auto context = impl_->context();
  const int size = this->size();
  return impl_->enqueue(
      internal::Fingerprint{"alltoall", input.scalar_type(), internal::Fingerprint::kUneven},
      resolve_timeout(options.timeout), args.keep({dense_output, dense_input}),
      args.wrap([output = dense_output, input = dense_input, layout, context, size, who](
                    uint32_t tag, std::chrono::milliseconds timeout) {
        const auto mine = layout.agreement_entry();
        auto entry = at::tensor(mine, at::kLong);
        auto table = at::empty({static_cast<int64_t>(mine.size()) * size}, at::kLong);
        allgather_words(context, entry, table, tag, timeout);
        internal::check_alltoall_agreement(table.data_ptr<int64_t>(), size, who);
        internal::HostStaging staging;
        auto host_output = staging.write(output);
        auto host_input = staging.read(input);
        if (host_input.storage().is_alias_of(host_output.storage())) {
          host_input = host_input.clone(); // read while the output is written
        }
        // Gloo moves bytes: counts in bytes, element size 1.
        const auto bytes = [&](const std::vector<int64_t>& counts) {
          std::vector<int64_t> result;
          for (const int64_t c : counts) {
            result.push_back(c * static_cast<int64_t>(input.element_size()));
          }
          return result;
        };
        gloo::AlltoallvOptions exchange(context);
        exchange.setInput(static_cast<uint8_t*>(host_input.data_ptr()), bytes(layout.send_counts));
        exchange.setOutput(static_cast<uint8_t*>(host_output.data_ptr()), bytes(layout.recv_counts));
        exchange.setTag(tag);
        exchange.setTimeout(timeout);
        gloo::alltoallv(exchange);
        staging.copy_back();
        return std::vector<at::Tensor>{output};
      }));
}

std::shared_ptr<Work> ProcessGroupGloo::barrier(const BarrierOptions& options) {
  auto context = impl_->context();
  return impl_->enqueue(
      internal::Fingerprint{"barrier"}, resolve_timeout(options.timeout), {},
      [context](uint32_t tag, std::chrono::milliseconds timeout) {
        gloo::BarrierOptions o(context);
        o.setTag(tag);
        o.setTimeout(timeout);
        gloo::barrier(o);
        return std::vector<at::Tensor>{};
      });
}

// ---- Point to point ----------------------------------------------------------------

std::shared_ptr<Work> ProcessGroupGloo::send(const at::Tensor& tensor, int dst_rank,
                                             const PointToPointOptions& options) {
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    // The transfer's own Work, which completes in wait(): its result is the view.
    internal::ComplexArguments complex;
    return send(complex.real(tensor), dst_rank, options);
  }
  const std::string who = rank_prefix() + " send";
  internal::check_point_to_point(tensor, dst_rank, options.tag, rank(), size(), who, "destination",
                                 kGlooRules);
  return impl_->start_point_to_point(true, tensor, dst_rank, options,
                              resolve_timeout(options.timeout), c10::str(who, " to rank ", dst_rank,
                                                                         " tag ", options.tag));
}

std::shared_ptr<Work> ProcessGroupGloo::recv(const at::Tensor& tensor, int src_rank,
                                             const PointToPointOptions& options) {
  if (internal::has_complex(tensor)) { // Note [Complex arguments]
    // The transfer's own Work, which completes in wait(): its result is the view.
    internal::ComplexArguments complex;
    return recv(complex.real(tensor), src_rank, options);
  }
  const std::string who = rank_prefix() + " recv";
  internal::check_point_to_point(tensor, src_rank, options.tag, rank(), size(), who, "source",
                                 kGlooRules);
  return impl_->start_point_to_point(false, tensor, src_rank, options,
                              resolve_timeout(options.timeout), c10::str(who, " from rank ", src_rank,
                                                                         " tag ", options.tag));
}

std::shared_ptr<Work> ProcessGroupGloo::Impl::start_point_to_point(bool is_send,
                                           const at::Tensor& tensor, int peer,
                                           const PointToPointOptions& options,
                                           std::chrono::milliseconds timeout, const std::string& who) {
  at::Tensor host = internal::PointToPointWork::host_buffer(tensor, is_send, who);
  auto buffer = context_->createUnboundBuffer(host.data_ptr(), host.nbytes());
  const uint64_t slot = gloo::Slot::build(kPointToPointSlotPrefix, static_cast<uint32_t>(options.tag));
  try {
    internal::SigpipeGuard guard; // posting may write at once: See Note [SIGPIPE and Gloo]
    if (is_send) {
      buffer->send(peer, slot);
    } else {
      buffer->recv(peer, slot);
    }
  } catch (const std::exception& e) {
    // Gloo refuses to post on a connection it has closed (after an earlier
    // failure or timeout of this group).
    throw CommError(c10::str(who, ": cannot start: the connection to rank ", peer,
                             " is closed after an earlier failure. Gloo said: ", error_message(e)));
  }
  return std::make_shared<internal::GlooPointToPointWork>(who, timeout, is_send, tensor, host,
                                                     std::move(buffer));
}

} // namespace ddp
