#pragma once

// Complex tensors given to the Gloo, MPI and fake backends (private header).
// See Note [Complex arguments].

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ddp/comm/process_group.h>
#include <ddp/comm/types.h>
#include <ddp/comm/work.h>

namespace ddp::internal {

// Note [Complex arguments]
// torch.distributed takes complex tensors in every collective and in
// send/recv, on every backend: its Python layer views each one as a real
// tensor (torch.view_as_real: shape S becomes S + [2], the real and the
// imaginary part side by side) before it calls the backend, and refuses the
// reductions that are not the same thing on a pair of reals as on a complex
// number (PRODUCT, MIN, MAX and the bitwise ones; SUM and AVG are); its
// C++ Gloo backend takes them too, so DDP reduces complex gradients. ddp's
// users call the backends directly, so Gloo, MPI and the fake group do it
// at their entry: a call with a complex argument is made again with the
// real views, which every later step (checks, stand-ins for non-contiguous
// tensors, CUDA staging, fingerprints, the flight recorder) sees as
// ordinary Float, Double or Half tensors. The views alias the caller's
// tensors, so a result written into them is written into the complex
// tensors; the collective's Work is then completed with the caller's
// tensors as its result (the complex ones, as PyTorch's C++ backends give
// them), not the views. send and recv return their transfer's own Work,
// which completes in wait() (so no continuation could complete it), and
// whose result is the real view. NCCL maps a complex dtype onto its real
// NCCL type itself (nccl_support.h). Sparse complex tensors are left as
// they are, and refused by the dtype checks.
//
// Usage, first in a backend's collective:
//   if (has_complex(tensor)) {
//     check_complex_reduction(tensor, options.op, who);
//     ComplexArguments complex;
//     return complex.given_back(allreduce(complex.real(tensor), options));
//   }

// True when `tensor` is a defined, strided complex tensor (the kind that
// ComplexArguments views as real).
bool is_strided_complex(const at::Tensor& tensor);
bool has_complex(const at::Tensor& tensor);
bool has_complex(const std::vector<at::Tensor>& tensors);

// Throws c10::Error, prefixed with `who` ("[rank R/W] allreduce") and naming
// the dtype of the (first) complex tensor, unless `op` reduces complex
// numbers as pairs of reals: SUM and AVG.
void check_complex_reduction(const at::Tensor& tensor, ReduceOp op, const std::string& who);
void check_complex_reduction(const std::vector<at::Tensor>& tensors, ReduceOp op, const std::string& who);
void check_complex_reduction(at::ScalarType dtype, ReduceOp op, const std::string& who);

// The real views of one call's complex arguments, and what they stand for.
class ComplexArguments {
 public:
  // at::view_as_real(tensor) for a strided complex tensor; `tensor` itself
  // otherwise.
  at::Tensor real(const at::Tensor& tensor);
  std::vector<at::Tensor> real(const std::vector<at::Tensor>& tensors);

  // reduce_gradients' arguments with a complex `buffer` (1-D) in real
  // terms: the buffer as a flat real tensor of twice its elements, each
  // target's offset doubled and the target viewed as real and flattened. A
  // non-contiguous buffer or target, and a target of another dtype, is left
  // as it is, for reduce_gradients' checks to refuse.
  at::Tensor real_buffer(const at::Tensor& buffer);
  static std::vector<ReduceTarget> real_targets(std::vector<ReduceTarget> targets);

  // A Work completed as `work`, with each view of its result replaced by the
  // caller's tensor that it views.
  std::shared_ptr<Work> given_back(std::shared_ptr<Work> work) const;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> views_; // (view, caller's tensor)
};

} // namespace ddp::internal
