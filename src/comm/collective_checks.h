#pragma once

// Argument checks that every ProcessGroup backend makes alike (private
// header): the root rank, list lengths, and tensors against the one
// they must match. Each throws c10::Error through DDP_CHECK with the message
// shape of STYLE.md §4; `who` is "[rank R/W] op".
//
// What a backend supports (devices, dtypes, one GPU per process) stays in the
// backend: it hands its rules to the checks as `TensorRules`, whose `check`
// is called with each tensor and its name ("outputs[2]"). Each backend's
// collective then opens with one call, e.g. check_gather(...), so that every
// backend refuses the same misuse with the same message.

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>

#include <string>
#include <vector>

#include <ddp/comm/types.h>

namespace ddp::internal {

// Checks one tensor argument named `what` ("tensor", "outputs[2]").
using ElementCheck = c10::function_ref<void(const at::Tensor& t, const std::string& what)>;

// `root` names a rank of a group of `size`.
void check_root(int root, int size, const std::string& who);

// `t` (named `what`) has the dtype and element count of `reference` (named
// `reference_name`). Devices are the backend's concern.
void check_same_as(const at::Tensor& t, const at::Tensor& reference, const std::string& who,
                   const std::string& what, const std::string& reference_name);

// `list` (named `what`: "outputs", "inputs") holds one tensor per rank, each
// passing `check_element` (allgather, reduce_scatter).
void check_one_per_rank(const std::vector<at::Tensor>& list, int size, const std::string& who,
                        const char* what, ElementCheck check_element);

// Like check_one_per_rank on the root; empty on every other rank (gather's
// outputs, scatter's inputs).
void check_root_only_list(const std::vector<at::Tensor>& list, int rank, int root, int size,
                          const std::string& who, const char* what, ElementCheck check_element);

// `t` (named `what`) is dense (strided), which is checked before anything
// that a sparse tensor cannot answer (contiguity). `sparse_rule` finishes
// the message about a sparse COO tensor: what the backend does with them
// ("the Gloo backend reduces sparse tensors only in allreduce, one tensor
// per call").
void check_strided(const at::Tensor& t, const std::string& who, const std::string& what,
                   const char* sparse_rule);

// What one backend accepts; a backend keeps one constant of it.
struct TensorRules {
  // The backend's check of one tensor argument (device, dtype, layout);
  // `who` is "[rank R/W] op", `what` names the argument ("outputs[2]").
  void (*check)(const at::Tensor& t, const std::string& who, const std::string& what);
  // When set, every tensor of an operation must be on the device of its
  // first tensor, and this says why in the message ("the NCCL backend drives
  // one GPU per process").
  const char* one_device_reason = nullptr;
  // The backend's check of a sparse COO tensor argument, in the one
  // operation that takes them (allreduce); null when the backend reduces no
  // sparse tensor, and `check` refuses them everywhere.
  void (*check_sparse)(const at::Tensor& t, const std::string& who, const std::string& what) = nullptr;
};

// `t` (named `what`) passes the rules and matches `reference` as
// check_same_as does (and in device, under one_device_reason).
void check_matches(const at::Tensor& t, const at::Tensor& reference, const std::string& who,
                   const std::string& what, const std::string& reference_name,
                   const TensorRules& rules);

// ---- One call per operation ------------------------------------------------------

// broadcast and reduce: `tensor` and the root.
void check_rooted(const at::Tensor& tensor, int root, int size, const std::string& who,
                  const TensorRules& rules);

void check_allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, int size,
                     const std::string& who, const TensorRules& rules);

void check_allgather_into_tensor(const at::Tensor& output, const at::Tensor& input, int size,
                                 const std::string& who, const TensorRules& rules);

void check_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, int rank,
                  int root, int size, const std::string& who, const TensorRules& rules);

void check_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int rank,
                   int root, int size, const std::string& who, const TensorRules& rules);

// reduce_scatter: one input per rank, of output's dtype (and device, under
// one_device_reason); inputs[rank] has output's element count, the others
// any (uneven chunks, as PyTorch allows).
void check_reduce_scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int rank,
                          int size, const std::string& who, const TensorRules& rules);

// alltoall: comm/alltoall_splits.h.

// allreduce_coalesced: at least one tensor, each passing the rules, all of
// the dtype and device of the first. One tensor is named "tensor", several
// "tensors[i]".
void check_coalesced(const std::vector<at::Tensor>& tensors, const std::string& who,
                     const TensorRules& rules);

// allreduce of one sparse COO tensor, for a backend whose rules have
// check_sparse: the tensor passes it, and `op` is SUM (a sparse allreduce
// gathers every rank's entries and adds them up).
void check_sparse_allreduce(const at::Tensor& tensor, ReduceOp op, const std::string& who,
                            const TensorRules& rules);

// send and recv: `peer` is another rank, named by `role` ("destination",
// "source"); the tag is non-negative.
void check_point_to_point(const at::Tensor& tensor, int peer, int tag, int rank, int size,
                          const std::string& who, const char* role, const TensorRules& rules);

} // namespace ddp::internal
