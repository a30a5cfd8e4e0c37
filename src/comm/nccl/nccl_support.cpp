#include "comm/nccl/nccl_support.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include <ddp/comm/error.h>

#include "comm/complex_arguments.h"
#include "internal/check.h"
#include "internal/torch_compat.h"

namespace ddp::internal {

// ---- CudaEvent ---------------------------------------------------------------

CudaEvent::CudaEvent() {
  check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) {
    // An error here (the CUDA runtime unloading at exit) leaves nothing to do.
    (void)cudaEventDestroy(event_);
  }
}

void CudaEvent::record(cudaStream_t stream) {
  check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord");
}

bool CudaEvent::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError(); // not an error: clear it so that it is not reported later
    return false;
  }
  check_cuda(status, "cudaEventQuery");
  return true;
}

void CudaEvent::block(cudaStream_t stream) const {
  check_cuda(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

// ---- FingerprintSlots --------------------------------------------------------

FingerprintSlots::Lease::Lease(Lease&& other) noexcept
    : owner_(std::move(other.owner_)), index_(other.index_), host_(other.host_), device_(other.device_) {
  other.host_ = nullptr;
  other.device_ = nullptr;
}

FingerprintSlots::Lease& FingerprintSlots::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (owner_) {
      owner_->release(index_);
    }
    owner_ = std::move(other.owner_);
    index_ = other.index_;
    host_ = other.host_;
    device_ = other.device_;
    other.host_ = nullptr;
    other.device_ = nullptr;
  }
  return *this;
}

FingerprintSlots::Lease::~Lease() {
  if (owner_) {
    owner_->release(index_);
  }
}

std::shared_ptr<FingerprintSlots> FingerprintSlots::create() {
  return std::make_shared<FingerprintSlots>(PrivateTag{});
}

FingerprintSlots::Lease FingerprintSlots::acquire(const c10::cuda::CUDAStream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) {
    const auto count = static_cast<int64_t>(2 * kSlotsPerChunk);
    Chunk chunk;
    chunk.host = at::empty({count}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    {
      // Allocated for the communicator's stream: the caching allocator
      // reuses the block, once freed, only for work on that stream.
      c10::cuda::CUDAStreamGuard guard(stream);
      chunk.device = at::empty({count}, at::TensorOptions().dtype(at::kLong).device(stream.device()));
    }
    const size_t first = chunks_.size() * kSlotsPerChunk;
    // Room for every slot, so that `release` never allocates.
    free_.reserve(first + kSlotsPerChunk);
    chunks_.push_back(std::move(chunk));
    // Handed out lowest index first, so that a steady state reuses few slots.
    for (size_t i = kSlotsPerChunk; i-- > 0;) {
      free_.push_back(first + i);
    }
  }
  const size_t index = free_.back();
  free_.pop_back();
  const Chunk& chunk = chunks_[index / kSlotsPerChunk];
  const size_t offset = 2 * (index % kSlotsPerChunk);
  Lease lease;
  lease.owner_ = shared_from_this();
  lease.index_ = index;
  lease.host_ = chunk.host.data_ptr<int64_t>() + offset;
  lease.device_ = chunk.device.data_ptr<int64_t>() + offset;
  return lease;
}

void FingerprintSlots::release(size_t index) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(index); // within the capacity reserved in `acquire`
}

void FingerprintSlots::keep_until_exit(std::shared_ptr<FingerprintSlots> slots) {
  static std::mutex mutex;
  static std::vector<std::shared_ptr<FingerprintSlots>> kept; // guarded by mutex
  std::lock_guard<std::mutex> lock(mutex);
  kept.push_back(std::move(slots));
}

// ---- Types and operations ------------------------------------------------------

namespace {

// NCCL's type for one element of `dtype` (for complex dtypes, one component),
// or nullopt when NCCL has none.
std::optional<ncclDataType_t> element_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kByte:
    case at::kBool: // one byte holding 0 or 1
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kHalf:
    case at::kComplexHalf:
      return ncclFloat16;
    case at::kFloat:
    case at::kComplexFloat:
      return ncclFloat32;
    case at::kDouble:
    case at::kComplexDouble:
      return ncclFloat64;
    case at::kBFloat16:
      return ncclBfloat16;
// NCCL has Float8 types since 2.24.
#if DDP_TORCH_HAS_FLOAT8 && NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case at::ScalarType::Float8_e4m3fn:
      return ncclFloat8e4m3;
    case at::ScalarType::Float8_e5m2:
      return ncclFloat8e5m2;
#endif
#if DDP_TORCH_HAS_UINT32_UINT64
    case at::ScalarType::UInt32:
      return ncclUint32;
    case at::ScalarType::UInt64:
      return ncclUint64;
#endif
    default:
      return std::nullopt;
  }
}

} // namespace

NcclLayout movement_layout(const at::Tensor& tensor) {
  const auto dtype = tensor.scalar_type();
  const auto type = element_type(dtype);
  if (!type) {
    return {ncclUint8, static_cast<size_t>(tensor.nbytes())};
  }
  const size_t per_value = c10::isComplexType(dtype) ? 2 : 1;
  return {*type, static_cast<size_t>(tensor.numel()) * per_value};
}

NcclReduction nccl_reduction(at::ScalarType dtype, ReduceOp op, const std::string& who) {
  DDP_CHECK(op != ReduceOp::kBand && op != ReduceOp::kBor && op != ReduceOp::kBxor, who, ": ",
            to_string(op),
            " is not supported by the NCCL backend (NCCL has no bitwise reductions); use a Gloo "
            "group (Backend::kGloo, which also takes CUDA tensors) for bitwise reductions");
  const auto type = element_type(dtype);
  DDP_CHECK(type.has_value(), who, ": the NCCL backend cannot reduce dtype ", dtype,
            " (NCCL has no such type); cast the tensor to a dtype NCCL has (e.g. Int or Float), "
            "or use a Gloo group");

  NcclReduction reduction;
  reduction.type = *type;
  if (dtype == at::kBool) {
    // A bool is one byte holding 0 or 1: SUM and MAX are OR, PRODUCT and MIN
    // are AND, as in torch.distributed.
    DDP_CHECK(op != ReduceOp::kAvg, who, ": AVG is not defined for bool tensors; use SUM (logical OR) "
              "or MIN (logical AND)");
    reduction.op = (op == ReduceOp::kSum || op == ReduceOp::kMax) ? ncclMax : ncclMin;
    return reduction;
  }
  if (c10::isComplexType(dtype)) {
    // Componentwise operations only: a complex sum is the sum of its parts
    // (Note [Complex arguments]).
    check_complex_reduction(dtype, op, who);
    reduction.elements_per_value = 2;
  }
  switch (op) {
    case ReduceOp::kSum:
      reduction.op = ncclSum;
      break;
    case ReduceOp::kProduct:
      reduction.op = ncclProd;
      break;
    case ReduceOp::kMin:
      reduction.op = ncclMin;
      break;
    case ReduceOp::kMax:
      reduction.op = ncclMax;
      break;
    case ReduceOp::kAvg:
      DDP_CHECK(c10::isFloatingType(dtype) || c10::isComplexType(dtype), who,
                ": AVG needs a floating-point tensor (got dtype ", dtype, "); use SUM and divide");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      reduction.op = ncclAvg;
#else
      reduction.op = ncclSum;
      reduction.divide_after = true;
#endif
      break;
    default:
      DDP_INTERNAL_ASSERT(false, "unhandled ReduceOp ", static_cast<int>(op));
  }
  return reduction;
}

// ---- Errors ----------------------------------------------------------------------

std::string nccl_result_text(ncclResult_t result) {
  const char* name = "ncclUnknownResult";
  switch (result) {
    case ncclSuccess:
      name = "ncclSuccess";
      break;
    case ncclUnhandledCudaError:
      name = "ncclUnhandledCudaError";
      break;
    case ncclSystemError:
      name = "ncclSystemError";
      break;
    case ncclInternalError:
      name = "ncclInternalError";
      break;
    case ncclInvalidArgument:
      name = "ncclInvalidArgument";
      break;
    case ncclInvalidUsage:
      name = "ncclInvalidUsage";
      break;
    case ncclRemoteError:
      name = "ncclRemoteError";
      break;
    case ncclInProgress:
      name = "ncclInProgress";
      break;
    default:
      break;
  }
  return c10::str(name, " (", ncclGetErrorString(result), ")");
}

void check_nccl(ncclResult_t result, ncclComm_t comm, const std::string& what) {
  if (result == ncclSuccess || result == ncclInProgress) {
    return;
  }
  std::string detail;
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') {
    detail = c10::str("; NCCL said: ", last);
  }
  const std::string message = c10::str(what, " failed with ", nccl_result_text(result), detail);
  if (result == ncclRemoteError) {
    // NCCL does not say which peer; -1 is RemoteError's "not known".
    throw RemoteError(message + " (a peer probably exited or crashed)", -1);
  }
  throw CommError(message);
}

void check_cuda(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) {
    return;
  }
  throw CommError(c10::str(what, " failed with CUDA error ", cudaGetErrorName(error), " (",
                           cudaGetErrorString(error), ")"));
}

void copy_on_stream(void* destination, const void* source, size_t bytes, cudaStream_t stream,
                    const std::string& what) {
  if (bytes == 0 || destination == source) {
    return;
  }
  check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream), what);
}

void Backoff::pause() {
  std::this_thread::sleep_for(next_);
  next_ = std::min(next_ * 2, std::chrono::microseconds(1000));
}

} // namespace ddp::internal
