#include "comm/contiguous_arguments.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include "internal/check.h"

namespace ddp::internal {

void check_distinct_elements(const at::Tensor& tensor, const std::string& who,
                             const std::string& what) {
  DDP_CHECK(at::has_internal_overlap(tensor) != at::MemOverlap::Yes, who, ": ", what,
            " has elements that share memory (sizes ", tensor.sizes(), ", strides ",
            tensor.strides(), ", an expanded tensor?), so it cannot hold a result; expected a "
            "tensor whose elements are distinct, such as tensor.clone()");
}

at::Tensor ContiguousArguments::input(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_sparse() || tensor.is_contiguous()) {
    return tensor;
  }
  at::Tensor copy = tensor.contiguous();
  inputs_.emplace_back(tensor, copy);
  return copy;
}

std::vector<at::Tensor> ContiguousArguments::inputs(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> result;
  result.reserve(tensors.size());
  for (const auto& t : tensors) {
    result.push_back(input(t));
  }
  return result;
}

at::Tensor ContiguousArguments::output(const at::Tensor& tensor, const std::string& who,
                                       const std::string& what) {
  if (!tensor.defined() || tensor.is_sparse() || tensor.is_contiguous()) {
    return tensor;
  }
  check_distinct_elements(tensor, who, what);
  at::Tensor copy = tensor.contiguous();
  outputs_.emplace_back(tensor, copy);
  return copy;
}

std::vector<at::Tensor> ContiguousArguments::outputs(const std::vector<at::Tensor>& tensors,
                                                     const std::string& who, const char* what) {
  std::vector<at::Tensor> result;
  result.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    result.push_back(output(tensors[i], who, c10::str(what, "[", i, "]")));
  }
  return result;
}

std::vector<at::Tensor> ContiguousArguments::keep(std::vector<at::Tensor> keep) const {
  for (const auto& pair : inputs_) {
    keep.push_back(pair.first);
  }
  for (const auto& pair : outputs_) {
    keep.push_back(pair.first);
  }
  return keep;
}

void ContiguousArguments::copy_back() const {
  for (const auto& [original, copy] : outputs_) {
    original.copy_(copy);
  }
}

std::vector<at::Tensor> ContiguousArguments::originals(std::vector<at::Tensor> result) const {
  for (auto& t : result) {
    for (const auto& [original, copy] : outputs_) {
      if (t.is_same(copy)) {
        t = original;
      }
    }
    for (const auto& [original, copy] : inputs_) {
      if (t.is_same(copy)) {
        t = original;
      }
    }
  }
  return result;
}

} // namespace ddp::internal
