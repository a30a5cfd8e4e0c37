#pragma once

// Non-contiguous tensors given to a collective or to send/recv (private
// header). See Note [Non-contiguous arguments].

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace ddp::internal {

// Note [Non-contiguous arguments]
// PyTorch's collectives take any strided tensor: a column view, a
// channels-last batch, an expanded input. Gloo, MPI and NCCL move flat
// memory, so a backend calls its transport on contiguous stand-ins: a
// tensor the operation only reads is copied at the call (on the caller's
// thread and, for CUDA, its current stream, so the values are the ones at
// the call, as the other arguments'); a tensor it writes gets a contiguous
// copy too (allreduce reads it first), written back into the caller's
// tensor when the operation has run, before its Work completes, on the
// thread (and stream) that completes it. The Work's result holds the
// caller's tensors, never the stand-ins. An output whose elements share
// memory (an expanded tensor) cannot hold a result and is refused, as
// PyTorch's in-place operations refuse it. A contiguous argument is passed
// through untouched: the only cost is an empty list.
//
// Usage, in a backend's collective, after the argument checks:
//   ContiguousArguments args;
//   const at::Tensor in = args.input(input);
//   const at::Tensor out = args.output(output, who, "output");
//   return queue(..., args.keep({out, in}), args.wrap([in, out](...) { ...; return {out}; }));
//
// Throws unless `tensor`'s elements are distinct (an expanded tensor's are
// not), so that it can hold a result; `who` and `what` name the operation
// and the argument. Used by ContiguousArguments::output and by send/recv's
// receive buffer.
__attribute__((visibility("hidden"))) void check_distinct_elements(const at::Tensor& tensor,
                                                                   const std::string& who,
                                                                   const std::string& what);

//
// Hidden from libddp.so's exports, with everything instantiated from it:
// wrap() is instantiated with the backends' task types, which name Gloo's
// (and a private Gloo's symbols must not leave the library, see
// tests/comm/gloo/check_gloo_symbols_hidden.sh).
class __attribute__((visibility("hidden"))) ContiguousArguments {
 public:
  // A tensor the operation only reads: itself when contiguous, else a
  // contiguous copy.
  at::Tensor input(const at::Tensor& tensor);
  std::vector<at::Tensor> inputs(const std::vector<at::Tensor>& tensors);

  // A tensor the operation writes (and may read first): itself when
  // contiguous, else a contiguous copy, written back by copy_back(). Throws
  // when its elements overlap; `who` and `what` name the operation and the
  // argument for that message.
  at::Tensor output(const at::Tensor& tensor, const std::string& who, const std::string& what);
  std::vector<at::Tensor> outputs(const std::vector<at::Tensor>& tensors, const std::string& who,
                                  const char* what);

  // Whether any argument was replaced.
  bool any() const {
    return !inputs_.empty() || !outputs_.empty();
  }

  // `keep` (the tensors the operation uses, stand-ins included) plus the
  // caller's tensors that were replaced, so that the backend keeps those
  // alive and orders later operations on them after this one.
  std::vector<at::Tensor> keep(std::vector<at::Tensor> keep) const;

  // Writes every output stand-in back into the caller's tensor.
  void copy_back() const;

  // `result` with each stand-in replaced by the caller's tensor.
  std::vector<at::Tensor> originals(std::vector<at::Tensor> result) const;

  // `run` (a backend's task, returning the operation's result), followed by
  // copy_back() and originals(): for the backend to run where the
  // operation completes.
  // The task lets go of the caller's tensors before the operation
  // completes, while the caller still holds them (it waits, or passed
  // them): the last reference to a caller's tensor is never dropped on the
  // backend's thread after the caller has moved on.
  template <typename Run>
  auto wrap(Run run) const {
    return [run = std::move(run), self = *this](auto&&... args) mutable {
      std::vector<at::Tensor> result = run(std::forward<decltype(args)>(args)...);
      if (!self.any()) {
        return result;
      }
      self.copy_back();
      result = self.originals(std::move(result));
      self = ContiguousArguments();
      return result;
    };
  }

 private:
  // (caller's tensor, contiguous stand-in)
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs_;
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;
};

} // namespace ddp::internal
