#include "comm/complex_arguments.h"

#include <ATen/ATen.h>

#include "internal/check.h"

namespace ddp::internal {

bool is_strided_complex(const at::Tensor& tensor) {
  return tensor.defined() && tensor.layout() == at::kStrided && tensor.is_complex();
}

bool has_complex(const at::Tensor& tensor) {
  return is_strided_complex(tensor);
}

bool has_complex(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (is_strided_complex(t)) {
      return true;
    }
  }
  return false;
}

void check_complex_reduction(const at::Tensor& tensor, ReduceOp op, const std::string& who) {
  check_complex_reduction(std::vector<at::Tensor>{tensor}, op, who);
}

void check_complex_reduction(const std::vector<at::Tensor>& tensors, ReduceOp op, const std::string& who) {
  for (const auto& t : tensors) {
    if (is_strided_complex(t)) {
      check_complex_reduction(t.scalar_type(), op, who);
      return;
    }
  }
}

void check_complex_reduction(at::ScalarType dtype, ReduceOp op, const std::string& who) {
  DDP_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg, who, ": ", to_string(op),
            " is not defined for complex dtype ", dtype,
            "; only SUM and AVG are, which act on the real and imaginary parts apart (as in "
            "torch.distributed)");
}

at::Tensor ComplexArguments::real(const at::Tensor& tensor) {
  if (!is_strided_complex(tensor)) {
    return tensor;
  }
  auto view = at::view_as_real(tensor);
  views_.emplace_back(view, tensor);
  return view;
}

std::vector<at::Tensor> ComplexArguments::real(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) {
    views.push_back(real(t));
  }
  return views;
}

at::Tensor ComplexArguments::real_buffer(const at::Tensor& buffer) {
  if (!is_strided_complex(buffer) || !buffer.is_contiguous()) {
    return buffer;
  }
  auto view = at::view_as_real(buffer).view({-1});
  views_.emplace_back(view, buffer);
  return view;
}

std::vector<ReduceTarget> ComplexArguments::real_targets(std::vector<ReduceTarget> targets) {
  for (auto& target : targets) {
    if (is_strided_complex(target.target) && target.target.is_contiguous()) {
      target.offset *= 2;
      target.target = at::view_as_real(target.target).view({-1});
    }
  }
  return targets;
}

std::shared_ptr<Work> ComplexArguments::given_back(std::shared_ptr<Work> work) const {
  if (views_.empty()) {
    return work;
  }
  return work->then([views = views_](const std::vector<at::Tensor>& result) {
    std::vector<at::Tensor> given = result;
    for (auto& t : given) {
      for (const auto& [view, caller] : views) {
        if (t.is_same(view)) {
          t = caller;
          break;
        }
      }
    }
    return given;
  });
}

} // namespace ddp::internal
