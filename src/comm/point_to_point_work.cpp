#include "comm/point_to_point_work.h"

#include <ATen/ATen.h>

#include <exception>
#include <utility>

#include "comm/contiguous_arguments.h"

namespace ddp::internal {

at::Tensor PointToPointWork::host_buffer(const at::Tensor& tensor, bool is_send,
                                         const std::string& who) {
  if (!tensor.is_cuda() && tensor.is_contiguous()) {
    return tensor;
  }
  if (!is_send) {
    check_distinct_elements(tensor, who, "the tensor");
  }
  at::Tensor host = at::empty(tensor.sizes(), tensor.options()
                                                  .device(at::kCPU)
                                                  .memory_format(at::MemoryFormat::Contiguous)
                                                  .pinned_memory(tensor.is_cuda()));
  if (is_send) {
    host.copy_(tensor);
  }
  return host;
}

PointToPointWork::PointToPointWork(std::string name, std::chrono::milliseconds default_timeout,
                                   bool is_send, at::Tensor tensor, at::Tensor host)
    : Work(std::move(name), default_timeout),
      default_timeout_(default_timeout),
      is_send_(is_send),
      tensor_(std::move(tensor)),
      host_(std::move(host)) {}

void PointToPointWork::release_transfer() {
  std::lock_guard<std::mutex> lock(transfer_mutex_);
  abandon_transfer();
}

void PointToPointWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kUseGroupTimeout) {
    timeout = default_timeout_;
  }
  {
    std::lock_guard<std::mutex> lock(transfer_mutex_);
    if (!is_completed()) {
      try {
        wait_for_transfer(timeout);
        if (!is_send_ && host_.data_ptr() != tensor_.data_ptr()) {
          tensor_.copy_(host_);
        }
        set_result({tensor_});
      } catch (...) {
        set_error(std::current_exception());
      }
    }
  }
  Work::wait(timeout);
}

} // namespace ddp::internal
